"""Enumerate, price and rank: the search behind `lmspec plan`.

A layout whose exposed communication draws lmspec's own communication warning (`summary.comm_over_warning`,
the condition of rules/budget.communication_within_budget on the same step time) is kept, counted and shown,
but ranked below every layout that fits without it: the winner is one `lmspec compile` accepts without that
warning whenever such a layout exists, even where the step-time model prices a flagged one faster (the
warning says that layout's step is mostly communication the model can only estimate; plan's output says how
much faster the fastest flagged layout is priced). Only when every layout that fits is flagged does one win."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from lmspec.compiler.models.summary import comm_over_warning
from lmspec.compiler.search.evaluate import Priced, price
from lmspec.compiler.search.space import Axes, default_axes, enumerate_legal
from lmspec.compiler.spec.sections import TrainingSpec

OBJECTIVES = ("throughput", "cost", "min-gpus")
BUDGET = "memory budget (budget.training_fits_memory)"
MAX_FALLBACK_GPUS = 65536  # how far the "fewest GPUs that fit" search goes when nothing fits


@dataclass(frozen=True)
class SearchResult:
    spec: TrainingSpec
    axes: Axes
    raw_size: int
    rejected: dict[str, int]  # rule -> raw candidates it rejected first; BUDGET -> legal ones over memory
    priced: Priced
    ranked: np.ndarray  # the best indices into priced.feasible, best first (at least `top` + 1)
    flagged: np.ndarray  # per feasible candidate: the communication warning fires (ranked below the rest)
    objective: str
    seconds: float

    @property
    def legal(self) -> int:
        return self.priced.columns.size

    @property
    def feasible(self) -> int:
        return self.priced.feasible.size

    @property
    def warned(self) -> int:
        """Layouts that fit but draw the communication warning."""
        return int(np.count_nonzero(self.flagged))


def _rank_group(priced: Priced, objective: str, keep: int, group: np.ndarray) -> np.ndarray:
    """The best `keep` of `group` (indices into `priced.feasible`), best first; ties go to the smaller memory.

    Only candidates whose primary key is within the best `keep` (ties included) are sorted."""
    f = priced.feasible
    tps, mem, world = priced.tokens_per_s[group], f.memory_bytes[group], f.world[group]
    if objective == "throughput":
        keys: tuple[np.ndarray, ...] = (mem, -tps)
    elif objective == "cost":
        keys = (mem, world, world / tps)  # GPU-seconds per token
    else:
        keys = (mem, -tps, world)
    primary = keys[-1]
    if primary.size > keep:
        threshold = np.partition(primary, keep - 1)[keep - 1]
        chosen = np.flatnonzero(primary <= threshold)
    else:
        chosen = np.arange(primary.size)
    return group[chosen[np.lexsort(tuple(k[chosen] for k in keys))][:keep]]


def rank(priced: Priced, objective: str, keep: int, flagged: np.ndarray | None = None) -> np.ndarray:
    """The best `keep` indices into `priced.feasible`, best first: every candidate not `flagged` (by the
    communication warning) before every flagged one, each group by `objective`."""
    if flagged is None:
        flagged = np.zeros(priced.feasible.size, dtype=bool)
    clean = _rank_group(priced, objective, keep, np.flatnonzero(~flagged))
    if clean.size >= keep:
        return clean
    return np.concatenate((clean, _rank_group(priced, objective, keep - clean.size, np.flatnonzero(flagged))))


def search(
    spec: TrainingSpec, nodes: Sequence[int], backends: Sequence[str], objective: str, top: int = 10
) -> SearchResult:
    """Every legal layout of `spec` on each node count, priced and ranked by `objective`."""
    start = time.perf_counter()
    axes = default_axes(spec, nodes, backends)
    found = enumerate_legal(spec, axes)
    values = {k: np.asarray(getattr(axes, k)) for k in ("tp", "cp", "micro_batch_size")}
    priced = price(spec, found.legal, values)
    rejected = dict(found.rejected)
    rejected[BUDGET] = int(priced.columns.size - np.count_nonzero(priced.fits))
    flagged = np.asarray(comm_over_warning(priced.time), dtype=bool)
    ranked = rank(priced, objective, top + 1, flagged)
    return SearchResult(
        spec=spec,
        axes=axes,
        raw_size=found.raw_size,
        rejected=rejected,
        priced=priced,
        ranked=ranked,
        flagged=flagged,
        objective=objective,
        seconds=time.perf_counter() - start,
    )


def fewest_gpus(spec: TrainingSpec, above_nodes: int, backends: Sequence[str]) -> SearchResult | None:
    """The smallest node count above `above_nodes` on which any legal layout fits, searched in
    doubling blocks of node counts; None when nothing fits up to MAX_FALLBACK_GPUS."""
    lo = above_nodes + 1
    limit = MAX_FALLBACK_GPUS // spec.hardware.gpus_per_node
    while lo <= limit:
        hi = min(2 * lo, limit)
        result = search(spec, range(lo, hi + 1), backends, "min-gpus")
        if result.feasible:
            return result
        lo = hi + 1
    return None
