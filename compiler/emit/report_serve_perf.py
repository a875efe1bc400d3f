"""REPORT.md's serving performance rows: the workload, TTFT, TPOT, throughput and goodput the
deployment reaches under it (lmspec.compiler.models.serve_perf), and what one step spends its time on."""

from __future__ import annotations

import math

from lmspec.compiler.emit.report_format import number, percent, rate
from lmspec.compiler.plan import Plan


def _ms(seconds: float) -> str:
    return (
        "never (the load exceeds what the deployment serves)" if math.isinf(seconds) else f"{number(seconds * 1e3)} ms"
    )


def _load(plan: Plan) -> str:
    w = plan.served().spec.serve.workload
    lengths = f"{w.input_tokens:,} in / {w.output_tokens:,} out ({w.distribution})"
    if w.concurrency is not None:
        return f"{lengths}, {w.concurrency:,} concurrent clients"
    if w.request_rate is not None:
        return f"{lengths}, {number(w.request_rate)} requests/s (Poisson)"
    return f"{lengths}, every request at once (the deployment's capacity)"


def serve_perf_rows(plan: Plan) -> list[tuple[str, str]]:
    served = plan.served()
    p, v = served.perf, served.spec.serve
    step = p.step
    parts = (
        ("linear layers", step.linear_s),
        ("attention", step.attention_s),
        ("communication", step.communication_s),
        ("host", step.overhead_s),
    )
    rows = [
        ("workload", _load(plan)),
        (
            "requests in each engine",
            f"{number(p.running_per_engine)} of at most {p.capacity_per_engine:,} (slots and KV cache), "
            f"{p.engines} engine(s)",
        ),
        ("TTFT", f"{_ms(p.ttft_s)} mean, {_ms(p.ttft_p_s)} p{p.percentile:g}"),
        (
            "TPOT",
            f"{_ms(p.tpot_s)}; a step: " + ", ".join(f"{name} {number(s * 1e3)} ms" for name, s in parts),
        ),
        (
            "throughput",
            f"{rate(p.output_tokens_per_s)} output tokens/s, {number(p.requests_per_s)} requests/s; "
            f"prefill {rate(p.prefill_tokens_per_s)} tokens/s per engine",
        ),
    ]
    if v.slo is not None:
        targets = ", ".join(
            f"{name} <= {number(ms)} ms" for name, ms in (("TTFT", v.slo.ttft_ms), ("TPOT", v.slo.tpot_ms)) if ms
        )
        attained = percent(p.slo_attainment or 0.0)
        rows.append(
            (
                "goodput",
                f"{number(p.goodput_rps)} requests/s with {v.slo.percentile:g}% within {targets or 'no target'} "
                f"(at the workload's load: {attained} within)",
            )
        )
    return rows
