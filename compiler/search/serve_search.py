"""Enumerate, judge, price and rank: the search behind `lmspec plan --serve`.

Ranked by goodput (DistServe's: the largest request rate at which serve.slo.percentile % of requests meet
serve.slo's TTFT and TPOT targets; the deployment's capacity when serve.slo is null), because that is what
a serving deployment is sized for: the traffic it carries within its latency targets. Ties go to the most
goodput per GPU (the same goodput from an engine whose copies leave fewer GPUs idle), then to the most
requests/s at the workload's load (it orders layouts that meet no SLO at all: goodput 0), then to the
larger KV cache per GPU (headroom for longer or more requests), then to the smaller engine (a dense model's
data-parallel ranks and replicas price the same; a smaller engine starts, fails and restarts alone).
Objective `cost` puts goodput per GPU first: what a deployment that will grow by whole engines should take.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass

from lmspec.compiler.search.serve_evaluate import PREFILL_BUDGET, PricedServe, fitting_memory, prefill_fits, price
from lmspec.compiler.search.serve_legality import BUDGET_RULE, refusal
from lmspec.compiler.search.serve_space import (
    ServeAxes,
    ServeCandidate,
    budget_gpus,
    candidates,
    pool_candidates,
    serve_axes,
)
from lmspec.compiler.spec.provenance import Origins
from lmspec.compiler.spec.sections import ServingSpec

SortKey = Callable[[PricedServe], tuple[float, ...]]


def _tail(p: PricedServe) -> tuple[float, ...]:
    c = p.candidate
    return (-p.perf.requests_per_s, -p.memory.cache_budget_bytes, c.engine_gpus, c.tp, c.pp, c.dp, c.expert_parallel)


OBJECTIVES: dict[str, SortKey] = {
    "throughput": lambda p: (-p.perf.goodput_rps, -p.goodput_per_gpu, *_tail(p)),
    "cost": lambda p: (-p.goodput_per_gpu, -p.perf.goodput_rps, *_tail(p)),
}


@dataclass(frozen=True)
class ServeSearchResult:
    spec: ServingSpec
    axes: ServeAxes
    rejected: dict[str, int]  # rule or search condition -> raw candidates it rejected first
    legal: int  # candidates every rule but the memory budget accepts
    longest_fit: int  # the most tokens a legal candidate's KV cache holds (what fits when none does)
    ranked: tuple[PricedServe, ...]  # every candidate that fits, best first
    objective: str
    seconds: float

    @property
    def raw_size(self) -> int:
        return self.axes.raw_size

    @property
    def feasible(self) -> int:
        return len(self.ranked)

    @property
    def budget_gpus(self) -> int:
        return budget_gpus(self.spec)


def search_serve(spec: ServingSpec, origins: Origins, objective: str = "throughput") -> ServeSearchResult:
    """Every serving layout of `spec` on its hardware that lmspec's rules accept and memory fits, ranked."""
    start = time.perf_counter()
    axes = serve_axes(spec)
    rejected: dict[str, int] = {}
    legal = longest = 0
    priced: list[PricedServe] = []
    for candidate in itertools.chain(candidates(spec, axes, rejected), pool_candidates(spec, axes, rejected)):
        applied = candidate.applied(spec)
        rule = refusal(applied, origins)
        if rule is not None:
            rejected[rule] = rejected.get(rule, 0) + 1
            continue
        legal += 1
        memory, fits = fitting_memory(applied)
        longest = max(longest, memory.max_tokens_in_cache)
        if not fits:
            rejected[BUDGET_RULE] = rejected.get(BUDGET_RULE, 0) + 1
            continue
        if not prefill_fits(applied):
            rejected[PREFILL_BUDGET] = rejected.get(PREFILL_BUDGET, 0) + 1
            continue
        priced.append(price(candidate, applied, memory))
    priced.sort(key=OBJECTIVES[objective])
    return ServeSearchResult(
        spec=spec,
        axes=axes,
        rejected=rejected,
        legal=legal,
        longest_fit=longest,
        ranked=tuple(priced),
        objective=objective,
        seconds=time.perf_counter() - start,
    )


def own_deployment(spec: ServingSpec, origins: Origins) -> PricedServe | None:
    """The spec's own serving layout priced as the search prices a candidate; None where a rule refuses it,
    it does not fit, or it is disaggregated (its pools are not among the candidates)."""
    if spec.serve.disaggregation is not None or refusal(spec, origins) is not None:
        return None
    v = spec.serve
    memory, fits = fitting_memory(spec)
    own = ServeCandidate(v.tp, v.pp, v.dp, v.expert_parallel, v.replicas)
    return price(own, spec, memory) if fits else None
