"""TP slowdown: the Plan's communication estimate says tensor-parallel traffic dominates the step
(the seed's "TP8 slower than TP4"), so more TP made the run slower, not faster.

Needs --build: plan.json's `comm` section (compiler/models/comm.py, nothing overlapped) gives
`share_of_step` (communication over compute + communication) and the seconds per step of each
kind (`tp_s`, `dp_s`, `ep_s`, `pp_s`, `compute_s`); the signature fires when the share passes 30%
and TP is the biggest kind. The log adds its last timed step as evidence when it has one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lmspec.compiler.models.comm import CommEstimate
from lmspec.compiler.models.units import gib
from lmspec.compiler.observe.doctor.findings import Evidence, Finding, Fix, LogText
from lmspec.compiler.observe.logs.context import RunContext
from lmspec.compiler.spec.override_text import override_value
from lmspec.compiler.spec.sections import TrainingSpec

COMM_SHARE_LIMIT = 0.30  # the seed: comm over 30% of the step is where TP stops paying
MAX_PP_MULTIPLE = 8  # how far the search adds pipeline stages to hold memory as TP drops
SHOWN_OPTIONS = 3
_KINDS = ("tp_s", "dp_s", "ep_s", "pp_s")


def tp_bound_comm(comm: CommEstimate) -> CommEstimate | None:
    """The Plan's comm estimate when communication passes the limit and TP is its biggest kind."""
    if comm.share_of_step <= COMM_SHARE_LIMIT or max(_KINDS, key=lambda k: getattr(comm, k)) != "tp_s":
        return None
    return comm


@dataclass(frozen=True)
class _Option:
    changes: dict[str, Any]
    share: float
    worst_bytes: int
    fits: bool


def _option(spec: TrainingSpec, changes: dict[str, Any]) -> _Option | None:
    """A layout change with the comm share and worst-GPU memory the models give it; None if illegal."""
    from lmspec.compiler.models.steptime import estimate_comm_and_step
    from lmspec.compiler.rules.budget import estimate, with_values

    changed = with_values(spec, changes)
    memory = estimate(changed)
    priced = estimate_comm_and_step(changed, memory) if memory is not None else None
    if memory is None or priced is None:
        return None
    return _Option(changes, priced[0].share_of_step, memory.worst.total_bytes, memory.fits)


def _candidates(spec: TrainingSpec) -> list[dict[str, Any]]:
    """Every lower TP that divides the heads, each with the pipeline stages multiplied by 1, 2, 4, ..."""
    tp, pp, layers = spec.parallel.tp, spec.parallel.pp, spec.model.num_layers
    out = []
    for lower in (d for d in range(tp - 1, 0, -1) if tp % d == 0):
        base: dict[str, Any] = {"parallel.tp": lower, "parallel.dp": "auto"}
        if lower == 1:
            base["parallel.sequence_parallel"] = False
        out.append(base)
        more = pp * 2
        while more <= layers and more <= pp * MAX_PP_MULTIPLE:
            out.append({**base, "parallel.pp": more, "parallel.pp_layout": "auto", "parallel.virtual_stages": None})
            more *= 2
    return out


def _tp_fixes(spec: TrainingSpec) -> list[Fix]:
    """The best lower-TP layouts by comm share: those that fit first, then the least comm."""
    options = [o for changes in _candidates(spec) if (o := _option(spec, changes)) is not None]
    options.sort(key=lambda o: (not o.fits, o.share > COMM_SHARE_LIMIT, o.share, o.worst_bytes))
    fixes = []
    for o in options[:SHOWN_OPTIONS]:
        (key, value), *rest = o.changes.items()
        also = f"with {' '.join(f'{k}={override_value(v)}' for k, v in rest)}: " if rest else ""
        fits = "fits" if o.fits else "over the memory budget"
        fixes.append(
            Fix(
                key,
                override_value(value),
                f"{also}comm {o.share:.0%} of the step, {gib(o.worst_bytes)} per GPU ({fits})",
            )
        )
    return fixes


class TpSlowdown:
    name = "tp_slowdown"
    watches = ()  # reads the Plan, and the log's steps (LogText.steps) only when the Plan says so

    def detect(self, log: LogText, context: RunContext | None) -> Finding | None:
        if context is None or not context.trains or context.plan.trained().layout.tp <= 1:
            return None
        comm = tp_bound_comm(context.plan.trained().comm)
        if comm is None:
            return None
        tp = context.plan.trained().layout.tp
        cause = (
            f"The Plan estimates communication at {comm.share_of_step:.0%} of the step (> "
            f"{COMM_SHARE_LIMIT:.0%}), most of it TP: {comm.tp_s:.3g} s of all-reduces per step against "
            f"{comm.compute_s:.3g} s of compute with tp={tp} on {context.spec.hardware.intra_node.link}. "
            "TP all-reduces activations twice per layer in forward and in backward, so more TP adds "
            "traffic faster than it removes compute."
        )
        shown = ", ".join(f"{k}={getattr(comm, k):.3g}" for k in ("share_of_step", "compute_s", *_KINDS))
        evidence = [Evidence(0, f"plan.json comm: {shown}")]
        last_timed = None
        for step in log.steps():
            if step.step_time_s:
                last_timed = step.line
        if last_timed is not None:
            evidence.append(Evidence(last_timed, log.line(last_timed).strip()[:240]))
        return Finding(
            self.name,
            "tensor parallelism dominated by communication",
            cause,
            tuple(evidence),
            tuple(_tp_fixes(context.training)),
        )
