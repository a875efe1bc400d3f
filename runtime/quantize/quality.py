"""What a quantization cost, as the quantize stage measured it: the record, its verdict and its review table.

The figure the spec bounds is the rise in perplexity on held-back sequences (exp of the mean next-token
negative log-likelihood), as a fraction of the unquantized model's: a model that answers worse shows it
there first, whatever the task. Beside it, on one fixed sequence, how often the quantized model's greedy
token is the unquantized one's, the mean KL divergence between their next-token distributions, and the
largest logit change. The record is written to runs/<name>/quantize_stage/ whatever the verdict, and inside
quantize.output only when accepted; the serve stage reads it back (`published_problems`) so a checkpoint
accepted under a looser bound than the spec's current one is not served.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmspec.compiler.build.files import QUALITY_JSON
from lmspec.compiler.spec.sections.quantize import QuantizeSpec

BOUND_KEY = "quantize.max_perplexity_increase"
OUTPUT_KEY = "quantize.output"


@dataclass(frozen=True, kw_only=True)
class Quality:
    scheme: str
    method: str
    group_size: int | None
    data: str  # where the calibration and held-back sequences came from
    calibration_tokens: int
    eval_tokens: int
    perplexity_before: float
    perplexity_after: float
    increase: float  # perplexity_after / perplexity_before - 1
    max_increase: float  # the spec's bound
    accepted: bool
    top1_agreement: float
    kl_mean: float
    max_abs_logit_diff: float
    seconds: float
    device: str
    versions: dict[str, str]

    @classmethod
    def of(cls, q: QuantizeSpec, result: dict[str, Any], data: str) -> Quality:
        increase = result["perplexity_after"] / result["perplexity_before"] - 1.0
        return cls(
            scheme=q.scheme,
            method=q.method,
            group_size=q.group_size if q.scheme == "w4a16" else None,
            data=data,
            calibration_tokens=result["calibration_tokens"],
            eval_tokens=result["eval_tokens"],
            perplexity_before=result["perplexity_before"],
            perplexity_after=result["perplexity_after"],
            increase=increase,
            max_increase=q.max_perplexity_increase,
            accepted=increase <= q.max_perplexity_increase,
            top1_agreement=result["top1_agreement"],
            kl_mean=result["kl_mean"],
            max_abs_logit_diff=result["max_abs_logit_diff"],
            seconds=result["seconds"],
            device=result["device"],
            versions=result["versions"],
        )

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def refusal(self) -> str:
        return (
            f"perplexity on held-back data rose {self.increase:+.2%} ({self.perplexity_before:.4g} -> "
            f"{self.perplexity_after:.4g}), beyond {BOUND_KEY}={self.max_increase:g}; nothing was published. "
            "Calibrate on more or longer sequences (quantize.calibration.samples/seq_length), keep more modules "
            "in the model's dtype (quantize.keep), use gptq or a finer quantize.group_size, a wider scheme "
            f"(fp8_dynamic, int8), or accept more with {BOUND_KEY}"
        )

    def summary(self) -> str:
        return (
            f"quantize: perplexity {self.perplexity_before:.4g} -> {self.perplexity_after:.4g} "
            f"({self.increase:+.2%}, bound {self.max_increase:+.2%}); greedy tokens agree at "
            f"{self.top1_agreement:.1%}, KL {self.kl_mean:.3g}/token"
        )


def quality_markdown(quality: Quality) -> str:
    """The review table, as REPORT.md writes its sections."""
    scheme = quality.scheme + (f", groups of {quality.group_size}" if quality.group_size else "")
    verdict = "accepted" if quality.accepted else "REFUSED (nothing published)"
    rows = [
        ("scheme", f"{scheme} ({quality.method})"),
        ("data", quality.data),
        ("tokens", f"{quality.calibration_tokens:,} calibrated on, {quality.eval_tokens:,} held back"),
        ("perplexity, unquantized", f"{quality.perplexity_before:.4f}"),
        ("perplexity, quantized", f"{quality.perplexity_after:.4f}"),
        ("increase", f"{quality.increase:+.2%} (bound {BOUND_KEY}={quality.max_increase:g}): {verdict}"),
        ("greedy token agreement", f"{quality.top1_agreement:.2%} of positions of one held-back sequence"),
        ("KL(unquantized || quantized)", f"{quality.kl_mean:.4g} nats per token"),
        ("largest logit change", f"{quality.max_abs_logit_diff:.4g}"),
        ("time", f"{quality.seconds:.1f} s on {quality.device}"),
        ("versions", ", ".join(f"{name} {v}" for name, v in sorted(quality.versions.items()))),
    ]
    lines = ["## Quantization quality", "", "| | |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows)]
    return "\n".join(lines) + "\n"


def published_problems(q: QuantizeSpec, output: Path) -> list[str]:
    """Why the checkpoint at quantize.output must not be served under the spec as it is now; empty when it may."""
    record = output / QUALITY_JSON
    if not record.is_file():
        return [
            f"{OUTPUT_KEY}={output} holds no {QUALITY_JSON}: it was not published by the quantize stage; "
            "run `lmspec run BUILD --stage quantize`"
        ]
    try:
        doc = json.loads(record.read_text())
        scheme, method, increase = doc["scheme"], doc["method"], float(doc["increase"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return [f"{record} is unreadable ({exc}); run the quantize stage again"]
    problems = []
    if (scheme, method) != (q.scheme, q.method):
        problems.append(
            f"{output} holds a {scheme} ({method}) checkpoint but quantize.scheme={q.scheme}, "
            f"quantize.method={q.method}; run the quantize stage again"
        )
    if increase > q.max_perplexity_increase:
        problems.append(
            f"{output} was accepted at a perplexity increase of {increase:+.2%}, beyond {BOUND_KEY}="
            f"{q.max_perplexity_increase:g}; run the quantize stage again or raise the bound"
        )
    return problems
