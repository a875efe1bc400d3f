"""What `lmspec plan` shows: one row per layout, why it wins, what each rule rejected."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from lmspec.compiler.backends import BACKENDS as TRAINING_BACKENDS
from lmspec.compiler.models import (
    steptime,
    steptime_calibration,
    steptime_comm,
    steptime_compute,
    steptime_inputs,
    units,
)
from lmspec.compiler.models.comm import COMM_SHARE_WARNING
from lmspec.compiler.models.dims import world_size
from lmspec.compiler.models.summary import exposed_comm_ratio
from lmspec.compiler.search.legality import BACKENDS, RECOMPUTE, candidate_impl
from lmspec.compiler.search.search import SearchResult
from lmspec.compiler.spec.override_text import override_value

TERM_NAMES = {
    "compute": "compute",
    "tp_comm": "TP collectives",
    "ep_comm": "expert all-to-all",
    "cp_comm": "ring-attention traffic",
    "pp_comm": "pipeline send/recv",
    "bubble": "pipeline bubble",
    "dp_comm": "exposed DP traffic",
    "optimizer": "optimizer update",
}


@dataclass(frozen=True)
class Row:
    """One candidate in plain values."""

    rank: int
    index: int
    values: dict[str, Any]  # the searched keys as spec overrides would set them
    memory_bytes: float
    step_time_s: float
    tokens_per_s: float
    mfu: float
    terms_s: dict[str, float]
    why: str
    flagged: bool = False  # the communication warning fires (summary.comm_over_warning)

    @property
    def exposed_comm_ratio(self) -> float:
        """Exposed communication over compute: the communication warning's number."""
        comm = sum(self.terms_s[t] for t in ("tp_comm", "ep_comm", "cp_comm", "pp_comm", "dp_comm"))
        return comm / self.terms_s["compute"] if self.terms_s["compute"] else 0.0

    @property
    def comm_share(self) -> float:
        comm = sum(self.terms_s[t] for t in ("tp_comm", "ep_comm", "cp_comm", "pp_comm", "dp_comm"))
        return comm / self.step_time_s

    @property
    def bubble_share(self) -> float:
        return self.terms_s["bubble"] / self.step_time_s

    def layout_text(self) -> str:
        v = self.values
        parts = [f"TP{v['parallel.tp']}", f"PP{v['parallel.pp']}", f"DP{v['dp']}"]
        parts += [f"VP{v['parallel.virtual_stages']}"] if v["parallel.virtual_stages"] else []
        parts += [f"CP{v['parallel.cp']}"] if v["parallel.cp"] > 1 else []
        parts += [f"EP{v['parallel.ep']}"] if v["parallel.ep"] > 1 else []
        parts += ["SP"] if v["parallel.sequence_parallel"] else []
        parts += ["A2A-overlap"] if v["parallel.overlap.moe_a2a"] else []
        return " ".join(parts)

    def sharding_text(self) -> str:
        v = self.values
        backend = TRAINING_BACKENDS[v["train.backend"]]
        return backend.sharding_label(v["parallel.zero_stage"], v["parallel.distributed_optimizer"])


def values_of(result: SearchResult, i: int) -> dict[str, Any]:
    c = result.priced.feasible
    return {
        "hardware.nodes": int(c.nodes[i]),
        "gpus": int(c.world[i]),
        "dp": int(c.dp[i]),
        "parallel.tp": int(c.tp[i]),
        "parallel.pp": int(c.pp[i]),
        "parallel.virtual_stages": int(c.virtual_stages[i]) if c.virtual_stages[i] > 1 else None,
        "parallel.cp": int(c.cp[i]),
        "parallel.ep": int(c.ep[i]),
        "parallel.sequence_parallel": bool(c.sequence_parallel[i]),
        "parallel.zero_stage": int(c.zero_stage[i]),
        "parallel.distributed_optimizer": bool(c.distributed_optimizer[i]),
        "train.backend": BACKENDS[int(c.backend[i])],
        "train.transformer_impl": candidate_impl(BACKENDS[int(c.backend[i])], result.spec),
        "train.micro_batch_size": int(c.micro_batch_size[i]),
        "train.recompute": RECOMPUTE[int(c.recompute[i])],
        "parallel.overlap.moe_a2a": bool(c.moe_a2a[i]),
        "grad_accum_steps": int(c.micro_batches[i]),
    }


def _terms(result: SearchResult, i: int) -> dict[str, float]:
    t = result.priced.time
    return {name: float(getattr(t, name)[i]) for name in TERM_NAMES}


def _why(result: SearchResult, position: int) -> str:
    """What this row saves over the next one in the ranking (for the last row too)."""
    ranked = result.ranked
    i = int(ranked[position])
    if position + 1 >= ranked.size:
        return "the only layout that fits" if result.feasible == 1 else "last that fits"
    j = int(ranked[position + 1])
    p = result.priced
    world = p.feasible.world
    if result.objective == "min-gpus" and world[i] < world[j]:
        return f"fewer GPUs ({world[i]} vs {world[j]})"
    if result.objective == "cost" and world[i] != world[j]:
        per_gpu = [p.tokens_per_s[k] / world[k] for k in (i, j)]
        return f"{per_gpu[0] / per_gpu[1] - 1:.1%} more tokens/s per GPU than #{position + 2}"
    if not result.flagged[i] and result.flagged[j]:
        ratio = exposed_comm_ratio(result.priced.time)
        return (
            f"#{position + 2} and below draw the communication warning "
            f"({ratio[j]:.0%} of compute exposed > {COMM_SHARE_WARNING:.0%})"
        )
    a, b = _terms(result, i), _terms(result, j)
    saved = {name: b[name] - a[name] for name in TERM_NAMES}
    term = max(saved, key=lambda k: saved[k])
    faster = p.step_time_s[j] / p.step_time_s[i] - 1
    if faster <= 0:
        return f"same speed as #{position + 2}, less memory"
    return f"{faster:.1%} faster than #{position + 2}: {saved[term]:.3g} s less {TERM_NAMES[term]}"


def row_at(result: SearchResult, i: int, rank: int = 0, why: str = "") -> Row:
    """Feasible candidate `i` as a row (rank 0 and no why: a candidate outside the ranking)."""
    p = result.priced
    return Row(
        rank=rank,
        index=i,
        values=values_of(result, i),
        memory_bytes=float(p.feasible.memory_bytes[i]),
        step_time_s=float(p.step_time_s[i]),
        tokens_per_s=float(p.tokens_per_s[i]),
        mfu=float(p.mfu[i]),
        terms_s=_terms(result, i),
        why=why,
        flagged=bool(result.flagged[i]),
    )


def rows(result: SearchResult, top: int) -> list[Row]:
    return [
        row_at(result, i, position + 1, _why(result, position))
        for position, i in enumerate(result.ranked[:top].tolist())
    ]


def overrides(values: dict[str, Any]) -> list[str]:
    """TrainingSpec overrides that select this layout (dp derived, stages balanced)."""

    keys = (
        "hardware.nodes",
        "parallel.tp",
        "parallel.pp",
        "parallel.virtual_stages",
        "parallel.cp",
        "parallel.ep",
        "parallel.sequence_parallel",
        "parallel.zero_stage",
        "parallel.distributed_optimizer",
        "train.backend",
        "train.transformer_impl",
        "train.micro_batch_size",
        "train.recompute",
        "parallel.overlap.moe_a2a",
    )
    fixed = {
        "parallel.dp": "auto",
        "parallel.pp_layout": "auto",
        "parallel.offload_optimizer": "false",
        "parallel.offload_params": "false",
    }
    return [f"{k}={override_value(values[k])}" for k in keys] + [f"{k}={v}" for k, v in fixed.items()]


def rejection_lines(result: SearchResult) -> list[tuple[str, int]]:
    return sorted(((rule, n) for rule, n in result.rejected.items() if n), key=lambda item: -item[1])


def constants() -> dict[str, Any]:
    """The step-time model's named constants (its fitted calibration among them), as the JSON output documents
    them (units are not its own)."""
    found = {
        name: getattr(module, name)
        for module in (steptime, steptime_calibration, steptime_comm, steptime_compute, steptime_inputs)
        for name in dir(module)
        if name.isupper() and not hasattr(units, name)
    }
    out: dict[str, Any] = {}
    for name, value in sorted(found.items()):
        if isinstance(value, steptime_calibration.Calibration):
            out[name] = dataclasses.asdict(value)
        elif isinstance(value, (int, float, dict)):
            out[name] = value
    return out


def to_json(result: SearchResult, top: int, extra: dict[str, Any]) -> dict[str, Any]:
    table = rows(result, top)
    return {
        "objective": result.objective,
        "gpus": sorted({world_size(result.spec.hardware.gpus_per_node, int(n)) for n in result.axes.nodes}),
        "raw_candidates": result.raw_size,
        "legal_candidates": result.legal,
        "feasible_candidates": result.feasible,
        "communication_warned_candidates": result.warned,
        "fastest_warned": fastest_warned(result),
        "rejected": dict(sorted(result.rejected.items())),
        "seconds": round(result.seconds, 4),
        "candidates_per_s": round(result.raw_size / result.seconds) if result.seconds else None,
        "budget_bytes": result.priced.budget_bytes,
        "top": [
            {
                "rank": r.rank,
                **r.values,
                "memory_bytes": round(r.memory_bytes),
                "memory_gib": round(r.memory_bytes / units.GIB, 3),
                "step_time_s": round(r.step_time_s, 6),
                "tokens_per_s": round(r.tokens_per_s, 3),
                "mfu": round(r.mfu, 5),
                "comm_share": round(r.comm_share, 5),
                "exposed_comm_to_compute": round(r.exposed_comm_ratio, 5),
                "communication_warning": r.flagged,
                "bubble_share": round(r.bubble_share, 5),
                "terms_s": {k: round(v, 6) for k, v in r.terms_s.items()},
                "why": r.why,
                "overrides": overrides(r.values),
            }
            for r in table
        ],
        "current_layout": current_layout(result),
        "step_time_constants": constants(),
        **extra,
    }


def gib_number(n_bytes: float) -> str:
    """`52.1`: the GiB figure alone, one decimal and no separators: a table cell (`used/budget`), or a
    sentence that names the unit after it (units.gib writes `1,234.5 GiB` for messages)."""
    return f"{n_bytes / units.GIB:.1f}"


def fastest_warned(result: SearchResult) -> dict[str, Any] | None:
    """The fastest layout the communication warning flags, when it outruns the winner: its layout, its
    tokens/s as a share of the winner's and its exposed communication over compute; else None."""
    if not result.warned or result.flagged[int(result.ranked[0])]:
        return None
    tps = result.priced.tokens_per_s
    flagged = np.flatnonzero(result.flagged)
    i = int(flagged[np.argmax(tps[flagged])])
    winner = float(tps[int(result.ranked[0])])
    if tps[i] <= winner:
        return None
    r = row_at(result, i)
    return {
        "layout": f"{r.layout_text()} {r.sharding_text()}",
        "tokens_per_s": round(r.tokens_per_s, 3),
        "share_of_winner": round(r.tokens_per_s / winner, 5),
        "exposed_comm_to_compute": round(r.exposed_comm_ratio, 5),
    }


def warned_line(result: SearchResult) -> str | None:
    """What plan's text says about the layouts ranked below the rest for the communication warning."""
    if not result.warned:
        return None
    head = (
        f"{result.warned:,} of the {result.feasible:,} layouts that fit leave more than {COMM_SHARE_WARNING:.0%} "
        "of their compute time in exposed communication (lmspec's communication warning)"
    )
    if result.flagged[int(result.ranked[0])]:
        return head + "; every layout that fits does, so the winner draws the warning too"
    fastest = fastest_warned(result)
    if fastest is None:
        return head + ": ranked below the rest ('!' in the comm column)"
    return (
        head + f": ranked below the rest ('!' in the comm column); the fastest of them, {fastest['layout']}, is "
        f"priced at {fastest['share_of_winner']:.0%} of the winner's tokens/s with "
        f"{fastest['exposed_comm_to_compute']:.0%} of its compute exposed in communication"
    )


def print_table(result: SearchResult, top: int) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=200)
    g = result.spec.hardware
    title = (
        f"{result.spec.model.name} on {g.gpu.name}: best {min(top, result.feasible)} of {result.feasible:,} "
        f"layouts that fit (objective: {result.objective})"
    )
    table = Table(title=title, title_justify="left")
    for name, justify in (
        ("#", "right"),
        ("GPUs", "right"),
        ("layout", "left"),
        ("sharding", "left"),
        ("mbs", "right"),
        ("recompute", "left"),
        ("mem/GPU GiB", "right"),
        ("step s", "right"),
        ("tokens/s", "right"),
        ("MFU", "right"),
        ("comm", "right"),
        ("bubble", "right"),
        ("why", "left"),
    ):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for r in rows(result, top):
        v = r.values
        table.add_row(
            str(r.rank),
            str(v["gpus"]),
            r.layout_text(),
            r.sharding_text(),
            str(v["train.micro_batch_size"]),
            v["train.recompute"],
            f"{gib_number(r.memory_bytes)}/{gib_number(result.priced.budget_bytes)}",
            f"{r.step_time_s:.3g}",
            f"{r.tokens_per_s:,.0f}",
            f"{r.mfu:.1%}",
            f"{r.comm_share:.0%}{' !' if r.flagged else ''}",
            f"{r.bubble_share:.0%}",
            r.why,
        )
    console.print(table)
    console.print(
        f"searched {result.raw_size:,} candidates ({result.legal:,} legal, {result.feasible:,} fit) "
        f"in {result.seconds:.2f} s; rejected, by the first rule that rejects each:"
    )
    for rule, n in rejection_lines(result):
        console.print(f"  {n:>15,}  {rule}")
    warned = warned_line(result)
    if warned is not None:
        console.print(warned)
    own = current_layout(result)
    if own is not None:
        console.print(own)


def current_layout(result: SearchResult) -> str | None:
    """Where the spec's own layout stands among the candidates, or None when it is outside the
    searched space (explicit stage list, offload, dp not auto)."""
    s = result.spec
    p, t = s.parallel, s.train
    if (
        p.dp != "auto"
        or isinstance(p.pp_layout, tuple)
        or p.offload_optimizer
        or p.offload_params
        or (p.pp_layout is None and s.model.num_layers % p.pp)
    ):
        return None
    want = {
        "nodes": s.hardware.nodes,
        "tp": p.tp,
        "pp": p.pp,
        "virtual_stages": p.virtual_stages or 1,
        "cp": p.cp,
        "ep": p.ep,
        "micro_batch_size": t.micro_batch_size,
        "sequence_parallel": p.sequence_parallel,
        "zero_stage": p.zero_stage,
        "distributed_optimizer": p.distributed_optimizer,
        "backend": BACKENDS.index(t.backend),
        "recompute": RECOMPUTE.index(t.recompute),
        "moe_a2a": p.overlap.moe_a2a,
    }
    shown = (
        f"TP{p.tp} PP{p.pp}{f' VP{p.virtual_stages}' if p.virtual_stages else ''} CP{p.cp} EP{p.ep}"
        f"{' SP' if p.sequence_parallel else ''}{' A2A-overlap' if p.overlap.moe_a2a else ''}, {t.backend}, "
        f"micro batch {t.micro_batch_size}, recompute {t.recompute}, {s.hardware.nodes} nodes"
    )

    def match(c: Any) -> np.ndarray:
        return np.logical_and.reduce([c[k] == v for k, v in want.items()])

    f = result.priced.feasible
    hit = np.flatnonzero(match(f))
    if hit.size:
        i = int(hit[0])
        tps = result.priced.tokens_per_s
        better = int(np.count_nonzero(tps > tps[i]))
        best = float(tps[int(result.ranked[0])])
        warned = (
            f"; it draws the communication warning ({exposed_comm_ratio(result.priced.time)[i]:.0%} of compute exposed)"
            if result.flagged[i]
            else ""
        )
        return (
            f"the spec's own layout ({shown}) fits at {gib_number(f.memory_bytes[i])} GiB and ranks #{better + 1} "
            f"by tokens/s: {tps[i]:,.0f} tokens/s, {tps[i] / best:.0%} of the winner{warned}"
        )
    legal = result.priced.columns
    hit = np.flatnonzero(match(legal))
    if hit.size:
        return (
            f"the spec's own layout ({shown}) needs {gib_number(result.priced.memory_bytes[int(hit[0])])} GiB per GPU, "
            f"over the {gib_number(result.priced.budget_bytes)} GiB budget"
        )
    if s.hardware.nodes not in result.axes.nodes:
        return None
    return f"the spec's own layout ({shown}) breaks a rule: run lmspec check for the message"
