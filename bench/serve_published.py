"""lmspec's serving performance model against published serving measurements (no GPU needed).

    .venv/bin/python bench/serve_published.py [--only ID ...] [--fit]

For each point of tests/data/serving/published_serving.json (issue 41's calibration set: the papers'
authors' own profiling data, vLLM's benchmark dashboard, MLPerf Inference), composes the serving job
through lmspec's API, prices it with compiler/models/serve_step.py and serve_traffic.py and prints each
measured figure (TPOT, TTFT) beside the prediction: the ratio per point, the median absolute error per
metric, and the leave-one-source-out median: for each source, the constants are fitted on the other
sources alone and the left-out source priced with them, so that figure measures prediction, not fitting.
`--fit` fits the constants on every point and writes compiler/models/serve_calibration.json.

What each source measured decides how it is priced:
- a batch started together (Splitwise's and Sarathi-Serve's profiles, `vllm bench latency`): TTFT is the
  prefill of the whole batch in one pass (those engines prefill a batch whole), TPOT the decode step;
- a request rate (MLPerf Server) or a saturated engine (MLPerf Offline): the steady state of
  serve_traffic. MLPerf's points state no prompt length, so they are listed as unpriced.
Splitwise's and Sarathi-Serve's profiles ran on vLLM forks from before vLLM's CUDA graphs (v0.2.4,
December 2023), so they are priced in eager mode; the dashboard's vLLM runs with CUDA graphs.

The hardware's constants (bandwidth and compute efficiency, kernel launch, collective latency) are shared
by every point. The host's work between forwards is the engine's own: those 2023 forks prepared each
sequence in Python and ran kernels of their day, and each fork is its own code: each gets its own host
overheads and compute share (FORKS: fitted and printed, never written), and only the dashboard's vLLM
points decide the ones lmspec uses.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from scipy.optimize import least_squares

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from lmspec.compiler.models import serve_step  # noqa: E402
from lmspec.compiler.models.serve_perf import engine_of  # noqa: E402
from lmspec.compiler.models.serve_step import ServeConstants  # noqa: E402
from lmspec.compiler.pipeline import derive_despite_rules  # noqa: E402

DATA = ROOT / "tests" / "data" / "serving" / "published_serving.json"
CALIBRATION_PATH = Path(serve_step.__file__).with_name(serve_step.CALIBRATION_FILE)
METRICS = ("tpot_ms", "ttft_ms")
# Released models without an lmspec preset, as the nearest preset plus the keys that make them that model.
# BLOOM and GPT-J have plain (not gated) 4h MLPs: the gated width with the same parameters is 8h/3.
MODELS: dict[str, list[str]] = {
    "meta-llama/Llama-2-70b": [
        "model=llama3_70b",
        "model.vocab_size=32000",
        "model.max_position_embeddings=4096",
        "model.rope_theta=10000",
    ],
    "meta-llama/Meta-Llama-3-8B": ["model=llama3_8b"],
    "meta-llama/Meta-Llama-3-70B": ["model=llama3_70b"],
    "mistralai/Mixtral-8x7B": ["model=mixtral_8x7b"],
    "01-ai/Yi-34B": [
        "model=llama3_70b",
        "model.num_layers=60",
        "model.hidden_size=7168",
        "model.ffn_hidden_size=20480",
        "model.num_attention_heads=56",
        "model.vocab_size=64000",
        "model.max_position_embeddings=200000",
    ],
    "bigscience/bloom": [
        "model=llama3_70b",
        "model.num_layers=70",
        "model.hidden_size=14336",
        "model.ffn_hidden_size=38229",
        "model.num_attention_heads=112",
        "model.num_kv_heads=112",
        "model.vocab_size=250880",
        "model.max_position_embeddings=8192",
    ],
}
# The GPU names the sources use, as hardware presets (Sarathi-Serve's A100 PCIe pairs: 1,935 GB/s HBM2e,
# a 600 GB/s NVLink bridge).
HARDWARE: dict[str, list[str]] = {
    "H100-SXM": ["hardware=h100_80g"],
    "H200": ["hardware=h200_141g"],
    "A100-SXM-80GB": ["hardware=a100_80g"],
    "A100-80GB-PCIe": ["hardware=a100_80g", "hardware.gpu.hbm_gb_per_s=1935", "hardware.intra_node.gb_per_s=600"],
}
EAGER_SOURCES = ("Splitwise", "Sarathi-Serve")
# Where each constant may land: the shares of a peak kernels are known to reach, and host times of the
# order a CPU launch or an NCCL call takes, so one term cannot stand in for another.
BOUNDS = {
    "bandwidth_efficiency": (0.5, 0.9),  # HBM streams reach ~0.9 of the datasheet at best
    "compute_efficiency": (0.2, 0.85),
    "step_overhead_s": (0.0, 0.02),
    "seq_overhead_s": (0.0, 2e-3),
    "launch_s": (2e-6, 1e-4),
    "collective_latency_s": (2e-6, 2e-4),
    "prefill_attention_efficiency": (0.1, 0.85),
}
# Per engine generation: its host work between forwards and its kernels' share of the tensor-core peak
# (2023's forks ran pre-FlashAttention-2 attention and GEMMs not tuned for Hopper); the rest are the hardware's.
HOST = ("step_overhead_s", "seq_overhead_s", "compute_efficiency", "prefill_attention_efficiency")
# The forks' Python scheduler prepared every sequence on the host: up to tens of ms a step.
FORK_BOUNDS = {"step_overhead_s": (0.0, 0.06), "seq_overhead_s": (0.0, 5e-3)}
# Where a constant stays when no point decides it: a Hopper's HBM reaches ~0.8 of its peak in a stream,
# cuBLAS ~0.6 of the tensor-core peak at serving shapes, vLLM V1's scheduler ~1 ms a step and ~20 us a
# sequence, a CUDA launch ~5 us, an NCCL or custom all-reduce ~10 us.
PRIORS = {
    "bandwidth_efficiency": 0.8,
    "compute_efficiency": 0.6,
    "step_overhead_s": 1e-3,
    "seq_overhead_s": 2e-5,
    "launch_s": 5e-6,
    "kernels_per_layer": 14,
    "collective_latency_s": 1e-5,
    # FlashAttention's decode and prefill kernels on a GPU (decode is mostly bound by its KV reads)
    "decode_attention_efficiency": 0.5,
    "prefill_attention_efficiency": 0.6,
    # host work CUDA graphs and vLLM V1's batched input preparation leave out on a GPU (vLLM's CPU
    # backend pays it: tests/serve/test_serve_cpu_timing.py measures it)
    "seq_layer_s": 0.0,
    "prefill_overhead_s": 0.0,
    "prefill_layer_s": 0.0,
    "token_overhead_s": 0.0,
    "token_layer_s": 0.0,
}
# What a group of points must vary for a constant to be fitted on it rather than kept at its prior: a
# per-sequence cost needs several batch sizes (else it trades with the per-step one), a compute share
# needs a measured prefill.
NEEDS = {
    "seq_overhead_s": lambda ps: len({p.point["workload"]["batch"] for p in ps}) > 1,
    "compute_efficiency": lambda ps: any("ttft_ms" in p.measured() for p in ps),
    "prefill_attention_efficiency": lambda ps: any("ttft_ms" in p.measured() for p in ps),
}
VLLM = "vLLM"  # the engine lmspec prices; a fork's constants are named "<source>.<constant>"


def _lookup(table: Mapping[str, list[str]], name: str) -> list[str] | None:
    return next((v for k, v in table.items() if name.startswith(k)), None)


@dataclass(frozen=True)
class Point:
    """One published measurement as lmspec prices it, or why it cannot."""

    point: Mapping[str, Any]
    served: Any = None  # the plan's ServePlan
    reason: str = ""

    @property
    def id(self) -> str:
        return str(self.point["id"])

    @property
    def source(self) -> str:
        return str(self.point["source"]).split(" (")[0].split(",")[0]

    def measured(self) -> dict[str, float]:
        m = self.point["measured"]
        return {k: float(m[k]) for k in METRICS if m.get(k) is not None}

    @property
    def engine(self) -> str:
        """The code that ran it: vLLM, or the source's own fork."""
        return self.source if str(self.point["source"]).startswith(EAGER_SOURCES) else VLLM

    def predicted(self, fitted: Fitted) -> dict[str, float]:
        # a fork left out of the fit has no constants of its own: it is priced as vLLM
        engine = engine_of(self.served.spec, self.served.memory, fitted.get(self.engine, fitted[VLLM]))
        batch = int(self.point["workload"]["batch"])
        ttft, tpot = engine.static_batch(batch)
        return {"ttft_ms": ttft * 1e3, "tpot_ms": tpot * 1e3}

    def ratios(self, fitted: Fitted) -> dict[str, float]:
        predicted = self.predicted(fitted)
        return {k: predicted[k] / v for k, v in self.measured().items()}


def overrides(point: Mapping[str, Any]) -> list[str] | str:
    """The point as `lmspec` overrides of a serve-only job, or why it has none."""
    model = _lookup(MODELS, point["model"])
    hardware = _lookup(HARDWARE, point["gpu"])
    w = point["workload"]
    if model is None or hardware is None:
        return f"no preset for {point['model']} on {point['gpu']}"
    if w.get("input_tokens") is None or w.get("batch") is None or w.get("request_rate") is not None:
        return "the source states no prompt length or no fixed batch"
    tp = int(point["tp"] or 1)
    prompt, output = int(w["input_tokens"]), int(w.get("output_tokens") or 1)
    eager = str(point["source"]).startswith(EAGER_SOURCES)  # engines without CUDA graphs
    return [
        *model,
        *hardware,
        "train=null",
        "parallel=null",
        "serve.model_path=/models/published",
        f"serve.tp={tp}",
        "serve.dtype=float16",
        f"serve.max_model_len={prompt + output}",
        f"serve.max_num_seqs={max(int(w['batch']), 1)}",
        f"serve.max_num_batched_tokens={max(int(w['batch']) * prompt, 8192)}",
        f"serve.enforce_eager={'true' if eager else 'false'}",
        f"serve.workload.input_tokens={prompt}",
        f"serve.workload.output_tokens={output}",
    ]


def compose(point: Mapping[str, Any]) -> Point:
    words = overrides(point)
    if isinstance(words, str):
        return Point(point, reason=words)
    derived = derive_despite_rules(words)
    if derived.plan is None or derived.plan.serve is None:
        errors = "; ".join(f"{p.key}: {p.message}" for p in derived.problems if p.severity == "error")
        return Point(point, reason=(errors or "no serving plan").splitlines()[0][:160])
    return Point(point, served=derived.plan.serve)


Fitted = dict[str, ServeConstants]  # by engine: VLLM's, and each fork's


def _names(points: Sequence[Point]) -> list[str]:
    forks = sorted({p.engine for p in points} - {VLLM})
    return [*BOUNDS, *(f"{fork}.{n}" for fork in forks for n in HOST)]


def _fitted(values: Mapping[str, float]) -> Fitted:
    vllm = ServeConstants(**{**PRIORS, **{n: values[n] for n in BOUNDS}})
    forks = {name.rsplit(".", 1)[0] for name in values if "." in name}
    own = {fork: {n: values[f"{fork}.{n}"] for n in HOST} for fork in forks}
    return {VLLM: vllm, **{fork: dataclasses.replace(vllm, **own[fork]) for fork in forks}}


def _log_ratios(points: Sequence[Point], fitted: Fitted) -> np.ndarray:
    return np.array([math.log(r) for p in points for r in p.ratios(fitted).values()])


def _fittable(name: str, points: Sequence[Point]) -> bool:
    """Whether `points` decide `name`: an engine's own constant only on that engine's points, and only
    when they vary what it stands for (NEEDS)."""
    engine, base = name.rsplit(".", 1) if "." in name else (VLLM, name)
    if base not in HOST:
        return True
    own = [p for p in points if p.engine == engine]
    return bool(own) and NEEDS.get(base, bool)(own)


def fit(points: Sequence[Point]) -> Fitted:
    """The constants minimising the squared log ratios over `points`, searched from the middle of each
    constant's bounds (so a fit depends on the points alone); kernels_per_layer stays the structural count.
    A constant no point decides (vLLM's host work, when its points are left out) keeps its prior."""
    names = _names(points)
    free = [n for n in names if _fittable(n, points)]
    bounds = [FORK_BOUNDS.get(n.split(".")[-1], BOUNDS[n.split(".")[-1]]) if "." in n else BOUNDS[n] for n in free]
    low, high = (np.array(b) for b in zip(*bounds))

    def values(x: np.ndarray) -> dict[str, float]:
        fixed = {n: PRIORS[n.split(".")[-1]] for n in names}
        return {**fixed, **{n: float(v) for n, v in zip(free, x)}}

    solved = least_squares(lambda x: _log_ratios(points, _fitted(values(x))), (low + high) / 2, bounds=(low, high))
    return _fitted({n: float(f"{v:.3g}") for n, v in values(solved.x).items()})


def leave_one_source_out(points: Sequence[Point]) -> dict[tuple[str, str], float]:
    """Each (point id, metric)'s absolute error when its source is left out of the fit."""
    errors: dict[tuple[str, str], float] = {}
    for source in sorted({p.source for p in points}):
        fitted = fit([p for p in points if p.source != source])
        for p in points:
            if p.source == source:
                errors.update({(p.id, k): abs(r - 1) for k, r in p.ratios(fitted).items()})
    return errors


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def report(points: Sequence[Point], fitted: Fitted, loso: Mapping[tuple[str, str], float]) -> dict[str, Any]:
    """Prints the per-point table and the medians; returns the summary the calibration file keeps."""
    print(f"{'point':<48} {'metric':<8} {'published':>10} {'lmspec':>10} {'ratio':>6} {'held-out':>9}")
    errors: dict[str, list[float]] = {k: [] for k in METRICS}
    held: dict[str, list[float]] = {k: [] for k in METRICS}
    for p in points:
        predicted, measured = p.predicted(fitted), p.measured()
        for k, v in measured.items():
            ratio = predicted[k] / v
            errors[k].append(abs(ratio - 1))
            out = loso.get((p.id, k))
            if out is not None:
                held[k].append(out)
            print(f"{p.id:<48} {k:<8} {v:>10.2f} {predicted[k]:>10.2f} {ratio:>6.2f} {_pct(out):>9}")
    summary = {}
    for k in METRICS:
        fitted = statistics.median(errors[k]) if errors[k] else None
        out = statistics.median(held[k]) if held[k] else None
        summary[k] = {"points": len(errors[k]), "median_error": _pct(fitted), "leave_one_source_out": _pct(out)}
        print(f"{k}: {len(errors[k])} points, median error {_pct(fitted)}, leave-one-source-out {_pct(out)}")
    return summary


def _current() -> Fitted:
    """The written calibration: vLLM's constants, and each fork's own as last fitted."""
    document = json.loads(CALIBRATION_PATH.read_text(encoding="utf-8"))
    vllm = ServeConstants(**document["constants"])
    forks = document.get("fork_constants", {})
    return {VLLM: vllm, **{fork: dataclasses.replace(vllm, **own) for fork, own in forks.items()}}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=None, help="point ids to price")
    parser.add_argument("--fit", action="store_true", help="fit the constants and write serve_calibration.json")
    args = parser.parse_args(argv)
    data = json.loads(DATA.read_text(encoding="utf-8"))
    composed = [compose(p) for p in data["points"] if not args.only or p["id"] in args.only]
    priced = [p for p in composed if p.served is not None]
    for p in composed:
        if p.served is None:
            print(f"unpriced {p.id}: {p.reason}")
    fitted = fit(priced) if args.fit else _current()
    loso = {} if args.only else leave_one_source_out(priced)
    summary = report(priced, fitted, loso)
    forks = {fork: {n: getattr(c, n) for n in HOST} for fork, c in fitted.items() if fork != VLLM}
    print("vLLM constants:", json.dumps(dataclasses.asdict(fitted[VLLM])))
    print("the forks' own:", json.dumps(forks))
    if args.fit:
        document = {
            "about": "Serving step constants (compiler/models/serve_step.py), fitted by bench/serve_published.py "
            "--fit (least squares on log(predicted / published) of TPOT and TTFT) to "
            "tests/data/serving/published_serving.json.",
            "command": ".venv/bin/python bench/serve_published.py --fit",
            "sources": sorted({p.source for p in priced}),
            "points": len(priced),
            "errors": summary,
            "constants": dataclasses.asdict(fitted[VLLM]),
            "fork_constants": forks,
        }
        kept = json.loads(CALIBRATION_PATH.read_text(encoding="utf-8")).get("cpu")  # bench/serve_cpu.py's
        document = {**document, **({"cpu": kept} if kept else {})}
        CALIBRATION_PATH.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {CALIBRATION_PATH.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
