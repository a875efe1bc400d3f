"""What `lmspec plan --serve` shows: one row per deployment, why it wins, what each rule rejected."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from lmspec.compiler.models.serve_layout import engine_nodes
from lmspec.compiler.models.serve_perf import perf_dict
from lmspec.compiler.models.units import SECONDS_PER_MINUTE
from lmspec.compiler.search.report import gib_number
from lmspec.compiler.search.serve_evaluate import PricedServe
from lmspec.compiler.search.serve_search import ServeSearchResult

SECONDS_PER_HOUR = 60 * SECONDS_PER_MINUTE


def layout_text(p: PricedServe) -> str:
    """`TP1 PP2 DP8 EP`: the engine, as the training table writes a layout; `prefill 1 x TP8 DP1 + decode
    1 x TP2 DP4 EP` for disaggregated pools (engines x each engine's layout)."""
    c = p.candidate
    ep = " EP" if c.expert_parallel else ""
    d = c.disaggregation
    if d is None:
        return f"TP{c.tp} PP{c.pp} DP{c.dp}{ep}"
    pools = " + ".join(
        f"{name} {q.engines} x TP{q.tp} DP{q.dp}" for name, q in (("prefill", d.prefill), ("decode", d.decode))
    )
    return pools + ep


def copies_text(p: PricedServe) -> str:
    """The replicas column: serve.replicas, or a dash for pools (each pool's engine count is in its layout)."""
    return "-" if p.candidate.disaggregation is not None else str(p.candidate.replicas)


def _ms(seconds: float) -> str:
    """A latency cell: an hour or more reads as the queue it is, not as a number of milliseconds."""
    if math.isinf(seconds):
        return "saturated"
    return "> 1 h" if seconds >= SECONDS_PER_HOUR else f"{seconds * 1e3:,.0f}"


def why(result: ServeSearchResult, position: int) -> str:
    """What this row has over the next one in the ranking."""
    ranked = result.ranked
    if position + 1 >= len(ranked):
        return "the only layout that fits" if len(ranked) == 1 else "last that fits"
    a, b = ranked[position], ranked[position + 1]
    per_gpu = result.objective == "cost"
    first = (a.goodput_per_gpu, b.goodput_per_gpu) if per_gpu else (a.perf.goodput_rps, b.perf.goodput_rps)
    unit = "goodput per GPU" if per_gpu else "goodput"
    if first[0] > first[1]:
        more = f"{first[0] / first[1] - 1:.1%} more" if first[1] else "some"
        return f"{more} {unit} than #{position + 2}"
    if a.goodput_per_gpu > b.goodput_per_gpu:
        return f"same goodput as #{position + 2} on fewer GPUs"
    if a.perf.requests_per_s > b.perf.requests_per_s:
        return f"same goodput as #{position + 2}, more requests/s at the workload's load"
    if a.memory.cache_budget_bytes > b.memory.cache_budget_bytes:
        return f"same goodput as #{position + 2}, a larger KV cache per GPU"
    return f"same, smaller engine than #{position + 2}"


def slo_line(result: ServeSearchResult) -> str:
    """What goodput means for this spec: its SLO, or the capacity when serve.slo is null."""
    v = result.spec.serve
    w = v.workload
    if w.concurrency is not None:
        load = f"{w.concurrency} clients"
    elif w.request_rate is not None:
        load = f"{w.request_rate:g} requests/s"
    else:
        load = "every request at once"
    traffic = f"{w.input_tokens} in / {w.output_tokens} out tokens ({w.distribution}), {load}"
    if v.slo is None:
        return (
            f"goodput: serve.slo is null, so it is each deployment's capacity (requests/s); latencies at the "
            f"workload's load ({traffic}); set serve.slo.ttft_ms/tpot_ms to rank by what meets them"
        )
    targets = [f"{name} <= {ms:g} ms" for name, ms in (("TTFT", v.slo.ttft_ms), ("TPOT", v.slo.tpot_ms)) if ms]
    return (
        f"goodput: requests/s with {v.slo.percentile:g}% of requests within {' and '.join(targets) or 'no target'} "
        f"(serve.slo); latencies at the workload's load ({traffic})"
    )


def row_dict(result: ServeSearchResult, position: int) -> dict[str, Any]:
    """One ranked deployment in plain values, for plan's JSON."""
    p = result.ranked[position]
    c = p.candidate
    applied = c.applied(result.spec)
    return {
        "rank": position + 1,
        "serve.tp": c.tp,
        "serve.pp": c.pp,
        "serve.dp": c.dp,
        "serve.expert_parallel": c.expert_parallel,
        "serve.replicas": c.replicas,
        "serve.disaggregation": None if c.disaggregation is None else dataclasses.asdict(c.disaggregation),
        "layout": layout_text(p),
        "gpus": c.gpus,
        "engine_gpus": c.engine_gpus,
        "nodes_per_engine": engine_nodes(applied),
        "goodput_per_gpu": round(p.goodput_per_gpu, 4),
        **perf_dict(p.perf),
        "weights_bytes_per_gpu": p.memory.weights_bytes_per_gpu,
        "kv_cache_bytes_per_gpu": p.memory.cache_budget_bytes,
        "kv_cache_tokens": p.memory.max_tokens_in_cache,
        "max_model_len_sequences": p.memory.max_concurrent_seqs,
        "why": why(result, position),
        "overrides": c.overrides(result.spec),
    }


def rejection_lines(result: ServeSearchResult) -> list[tuple[str, int]]:
    return sorted(((rule, n) for rule, n in result.rejected.items() if n), key=lambda item: -item[1])


def to_json(result: ServeSearchResult, top: int, extra: dict[str, Any]) -> dict[str, Any]:
    v = result.spec.serve
    return {
        "kind": "serve",
        "objective": result.objective,
        "gpus": result.budget_gpus,
        "raw_candidates": result.raw_size,
        "legal_candidates": result.legal,
        "feasible_candidates": result.feasible,
        "rejected": dict(sorted(result.rejected.items())),
        "seconds": round(result.seconds, 4),
        "slo": None
        if v.slo is None
        else {"ttft_ms": v.slo.ttft_ms, "tpot_ms": v.slo.tpot_ms, "percentile": v.slo.percentile},
        "top": [row_dict(result, i) for i in range(min(top, result.feasible))],
        **extra,
    }


def print_table(result: ServeSearchResult, top: int) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=200)
    hw = result.spec.hardware
    objective = "goodput per GPU" if result.objective == "cost" else "goodput"
    title = (
        f"{result.spec.model.name} serving on {result.budget_gpus} x {hw.gpu.name}: best {min(top, result.feasible)} "
        f"of {result.feasible:,} layouts that fit (objective: {objective})"
    )
    table = Table(title=title, title_justify="left")
    percentile = f"TTFT p{result.ranked[0].perf.percentile:g} ms" if result.ranked else "TTFT ms"
    for name, justify in (
        ("#", "right"),
        ("GPUs", "right"),
        ("engine", "left"),
        ("nodes", "right"),
        ("replicas", "right"),
        ("goodput req/s", "right"),
        ("/GPU", "right"),
        (percentile, "right"),
        ("TPOT ms", "right"),
        ("out tok/s", "right"),
        ("weights GiB", "right"),
        ("KV GiB", "right"),
        ("KV seqs", "right"),
        ("why", "left"),
    ):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for position, p in enumerate(result.ranked[:top]):
        c = p.candidate
        table.add_row(
            str(position + 1),
            str(c.gpus),
            layout_text(p),
            str(engine_nodes(c.applied(result.spec))),
            copies_text(p),
            f"{p.perf.goodput_rps:,.2f}",
            f"{p.goodput_per_gpu:,.3f}",
            _ms(p.perf.ttft_p_s),
            _ms(p.perf.tpot_s),
            f"{p.perf.output_tokens_per_s:,.0f}",
            gib_number(p.memory.weights_bytes_per_gpu),
            gib_number(p.memory.cache_budget_bytes),
            f"{p.memory.max_concurrent_seqs:,}",
            why(result, position),
        )
    console.print(table)
    console.print(slo_line(result))
    console.print(
        f"searched {result.raw_size:,} candidates ({result.legal:,} legal, {result.feasible:,} fit) "
        f"in {result.seconds:.2f} s; rejected, by the first rule that rejects each:"
    )
    for rule, n in rejection_lines(result):
        console.print(f"  {n:>15,}  {rule}")


def own_line(result: ServeSearchResult, own: PricedServe | None) -> str:
    """Where the spec's own serving layout stands against the winner."""
    v = result.spec.serve
    shown = f"TP{v.tp} PP{v.pp} DP{v.dp}{' EP' if v.expert_parallel else ''}, {v.replicas} replica(s)"
    if own is None:
        return f"the spec's own layout ({shown}) is not among them: run lmspec check for why"
    if not result.ranked:
        return f"the spec's own layout ({shown}) serves {own.perf.goodput_rps:,.2f} goodput requests/s"
    best = result.ranked[0].perf.goodput_rps
    rank = 1 + sum(p.perf.goodput_rps > own.perf.goodput_rps for p in result.ranked)
    share = f", {own.perf.goodput_rps / best:.0%} of the winner's" if best else ""
    return (
        f"the spec's own layout ({shown}) serves {own.perf.goodput_rps:,.2f} goodput requests/s on "
        f"{own.candidate.gpus} GPUs{share}: #{rank} by goodput"
    )
