"""Enumerate, price and rank: the search behind `lmspec plan`."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

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
    objective: str
    seconds: float

    @property
    def legal(self) -> int:
        return self.priced.columns.size

    @property
    def feasible(self) -> int:
        return self.priced.feasible.size


def rank(priced: Priced, objective: str, keep: int) -> np.ndarray:
    """The best `keep` indices into `priced.feasible`, best first; ties go to the smaller memory.

    Only candidates whose primary key is within the best `keep` (ties included) are sorted."""
    f = priced.feasible
    tps, mem, world = priced.tokens_per_s, f.memory_bytes, f.world
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
    return chosen[np.lexsort(tuple(k[chosen] for k in keys))][:keep]


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
    ranked = rank(priced, objective, top + 1)
    return SearchResult(
        spec=spec,
        axes=axes,
        raw_size=found.raw_size,
        rejected=rejected,
        priced=priced,
        ranked=ranked,
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
