"""The serving layouts `lmspec plan --serve` searches on the spec's hardware, and how many copies of each.

A candidate is one vLLM engine (serve.tp x serve.pp x serve.dp GPUs, the experts of a MoE model spread
over its tp x dp ranks or not: serve.expert_parallel) and serve.replicas copies of it. The space is the
product of the axes below; two of its conditions are the search's own, not a rule's (the rules never read
serve.replicas, and an engine may leave GPUs idle):

- the GPU budget: the engines, all replicas together, fit hardware.gpus_per_node x hardware.nodes;
- the engine tiles the nodes: its GPUs divide a node's or are whole nodes, so its copies fill the
  hardware; an engine of 3 or 12 GPUs on nodes of 8 leaves GPUs idle that a tiling engine serves with.

A disaggregated candidate (serve.disaggregation) is a prefill pool and a decode pool of engines joined by
vLLM's KV connector, each engine filling a node of its own (rules/serve_scale.py: one node per pool engine),
the nodes split between the pools; it needs two nodes at least. Its serve.tp/pp/dp are the decode engine's,
so the rules that read those keys (the memory budget among them) judge the engine that holds the KV cache
longest; the prefill engine's memory is judged by the search (serve_search). The connector is the spec's,
or NixlConnector, vLLM's reference.

The replicas are not an axis of their own: they are as many copies as the hardware holds. serve_perf splits
the load evenly over replicas x dp engines and multiplies each engine's goodput by their count, so fewer
copies only idle GPUs at the same goodput per GPU; a smaller deployment is planned with a smaller
hardware.nodes. TP stays inside the NVLink domain (1 to a node's GPUs, or to the part of a rack's NVLink domain
the hardware fills: models.dims.domain_gpus_of): rules/serving.py warns when TP leaves it and its fix is
serve.tp=<the domain's GPUs> with serve.pp across domains, which the space holds.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from lmspec.compiler.models.dims import domain_gpus_of, world_size
from lmspec.compiler.rules.budget import with_values
from lmspec.compiler.spec.override_text import override_value
from lmspec.compiler.spec.sections import ServingSpec
from lmspec.compiler.spec.sections.serve_scale import DisaggregationSpec, KvConnector, PoolSpec

GPU_BUDGET = "GPU budget (replicas x engine GPUs <= hardware.gpus_per_node x hardware.nodes)"
TILING = "engine tiles the nodes (its GPUs divide a node's, or are whole nodes)"
DEFAULT_CONNECTOR: KvConnector = "NixlConnector"


def pools_text(d: DisaggregationSpec) -> str:
    """`{kv_connector:NixlConnector,prefill:{tp:8,dp:1,engines:1},decode:{...}}`: the pools as one Hydra value."""
    pools = ",".join(
        f"{name}:{{tp:{p.tp},dp:{p.dp},engines:{p.engines}}}"
        for name, p in (("prefill", d.prefill), ("decode", d.decode))
    )
    return f"{{kv_connector:{d.kv_connector},{pools}}}"


@dataclass(frozen=True)
class ServeCandidate:
    """One deployment: `replicas` copies of a tp x pp x dp engine, or disaggregated pools (whose decode
    engine tp, pp and dp are)."""

    tp: int
    pp: int
    dp: int
    expert_parallel: bool
    replicas: int
    disaggregation: DisaggregationSpec | None = None

    @property
    def engine_gpus(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def gpus(self) -> int:
        d = self.disaggregation
        if d is None:
            return self.replicas * self.engine_gpus
        return sum(p.tp * p.dp * p.engines for p in (d.prefill, d.decode))

    def changes(self, spec: ServingSpec) -> dict[str, Any]:
        """The serve keys that select this deployment; a spec's disaggregated pools are replaced by the one
        engine (serve.disaggregation=null) the candidate is."""
        keys: dict[str, Any] = {"serve.tp": self.tp, "serve.pp": self.pp, "serve.dp": self.dp}
        if spec.model.moe is not None:
            keys["serve.expert_parallel"] = self.expert_parallel
        keys["serve.replicas"] = self.replicas
        if self.disaggregation is not None or spec.serve.disaggregation is not None:
            keys["serve.disaggregation"] = self.disaggregation
        return keys

    def overrides(self, spec: ServingSpec) -> list[str]:
        """`serve.tp=8 serve.dp=2 ...`: the words of the printed command, written as the spec is changed."""
        return [
            f"{k}={pools_text(v) if isinstance(v, DisaggregationSpec) else override_value(v)}"
            for k, v in self.changes(spec).items()
        ]

    def applied(self, spec: ServingSpec) -> ServingSpec:
        return with_values(spec, self.changes(spec))


@dataclass(frozen=True)
class ServeAxes:
    tp: tuple[int, ...]
    pp: tuple[int, ...]
    dp: tuple[int, ...]
    expert_parallel: tuple[bool, ...]
    prefill_engines: tuple[int, ...]  # of a disaggregated deployment; the decode pool takes the other nodes

    @property
    def raw_size(self) -> int:
        aggregated = len(self.tp) * len(self.pp) * len(self.dp)
        disaggregated = len(self.tp) ** 2 * len(self.prefill_engines)  # each pool engine's tp; dp fills its node
        return (aggregated + disaggregated) * len(self.expert_parallel)


def budget_gpus(spec: ServingSpec) -> int:
    return world_size(spec.hardware.gpus_per_node, spec.hardware.nodes)


def serve_axes(spec: ServingSpec) -> ServeAxes:
    """Every value worth trying: TP inside a node, a stage at least one layer, and for MoE models DP up to the
    budget with the experts spread over the ranks or not. A dense model's data-parallel ranks share nothing
    (vLLM runs each as an engine of its own, serve_perf prices them as replicas), so serve.dp=1 there and its
    copies are replicas; rules/serving.py refuses expert parallel on a dense model."""
    budget = budget_gpus(spec)
    moe = spec.model.moe is not None
    return ServeAxes(
        tp=tuple(range(1, domain_gpus_of(spec.hardware) + 1)),
        pp=tuple(range(1, min(spec.model.num_layers, budget) + 1)),
        dp=tuple(range(1, budget + 1)) if moe else (1,),
        expert_parallel=(False, True) if moe else (False,),
        prefill_engines=tuple(range(1, spec.hardware.nodes)),
    )


def replicas_that_fit(spec: ServingSpec, engine_gpus: int) -> int:
    """Copies of an engine of `engine_gpus` that the hardware holds: several per node, or one per whole
    nodes it takes; 0 where it does not tile the nodes."""
    per_node, nodes = spec.hardware.gpus_per_node, spec.hardware.nodes
    if engine_gpus <= per_node:
        return nodes * (per_node // engine_gpus) if per_node % engine_gpus == 0 else 0
    return nodes // (engine_gpus // per_node) if engine_gpus % per_node == 0 else 0


def candidates(spec: ServingSpec, axes: ServeAxes, rejected: dict[str, int]) -> Iterator[ServeCandidate]:
    """The candidates within the budget that tile the nodes, each filled with replicas; what the two
    conditions reject of the raw space is added to `rejected`."""
    budget = budget_gpus(spec)
    n_ep = len(axes.expert_parallel)
    for tp in axes.tp:
        for pp in axes.pp:
            within = [dp for dp in axes.dp if tp * pp * dp <= budget]
            rejected[GPU_BUDGET] = rejected.get(GPU_BUDGET, 0) + (len(axes.dp) - len(within)) * n_ep
            for dp in within:
                replicas = replicas_that_fit(spec, tp * pp * dp)
                if not replicas:
                    rejected[TILING] = rejected.get(TILING, 0) + n_ep
                    continue
                for expert_parallel in axes.expert_parallel:
                    yield ServeCandidate(tp, pp, dp, expert_parallel, replicas)


def pool_candidates(spec: ServingSpec, axes: ServeAxes, rejected: dict[str, int]) -> Iterator[ServeCandidate]:
    """Disaggregated candidates: each pool engine a node of tp x dp GPUs, the nodes split between the pools."""
    per_node = spec.hardware.gpus_per_node
    shapes = [(tp, per_node // tp) for tp in axes.tp if per_node % tp == 0]
    idle = (len(axes.tp) ** 2 - len(shapes) ** 2) * len(axes.prefill_engines) * len(axes.expert_parallel)
    rejected[TILING] = rejected.get(TILING, 0) + idle
    d = spec.serve.disaggregation
    connector = d.kv_connector if d is not None else DEFAULT_CONNECTOR
    for prefill, decode, engines, expert_parallel in itertools.product(
        shapes, shapes, axes.prefill_engines, axes.expert_parallel
    ):
        pools = DisaggregationSpec(
            kv_connector=connector,
            prefill=PoolSpec(tp=prefill[0], dp=prefill[1], engines=engines),
            decode=PoolSpec(tp=decode[0], dp=decode[1], engines=spec.hardware.nodes - engines),
        )
        yield ServeCandidate(decode[0], 1, decode[1], expert_parallel, 1, pools)
