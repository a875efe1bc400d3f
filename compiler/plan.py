"""The Plan: the one input of every emitter, built once from a validated spec.

Frozen, typed, with every derived number filled in, so no emitter re-derives
anything and every artifact agrees with every other.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from lmspec.compiler import __version__
from lmspec.compiler.errors import Problem
from lmspec.compiler.models.comm import CommEstimate, estimate_comm
from lmspec.compiler.models.dims import ParallelDims
from lmspec.compiler.models.params import ParamCounts, count_params
from lmspec.compiler.models.serve_memory import ServeMemory, estimate_serve_memory
from lmspec.compiler.models.summary import (
    FlopsSummary,
    comm_dict,
    flops_dict,
    flops_summary,
    memory_dict,
    params_dict,
    serve_dict,
)
from lmspec.compiler.models.train_memory import TrainMemory, estimate_train_memory
from lmspec.compiler.spec.load import Composed
from lmspec.compiler.spec.sections import Spec


@dataclass(frozen=True, kw_only=True)
class Layout:
    """Every parallel degree, resolved (no `auto` left)."""

    world_size: int
    nodes: int
    gpus_per_node: int
    tp: int
    pp: int
    dp: int
    cp: int
    ep: int
    etp: int
    expert_dp: int  # replicas of each expert shard: world / (etp x ep x pp)
    stage_layers: tuple[int, ...]
    virtual_stages: int | None
    sequence_parallel: bool
    zero_stage: int
    distributed_optimizer: bool


@dataclass(frozen=True, kw_only=True)
class Batch:
    micro_batch_size: int
    global_batch_size: int
    grad_accum_steps: int
    seq_length: int
    tokens_per_step: int


@dataclass(frozen=True, kw_only=True)
class Plan:
    lmspec_version: str
    spec: Spec
    layout: Layout
    batch: Batch
    params: ParamCounts
    memory: TrainMemory  # per-GPU training memory of every pipeline stage
    flops: FlopsSummary
    serving: ServeMemory
    comm: CommEstimate  # communication per step against compute, nothing overlapped
    overrides: tuple[str, ...]
    choices: tuple[tuple[str, str], ...]
    warnings: tuple[Problem, ...]

    @property
    def name(self) -> str:
        return self.spec.name

    def spec_dict(self) -> dict[str, Any]:
        """The resolved spec as plain data (lists, not tuples), in the sections' order."""
        return _plain(dataclasses.asdict(self.spec))

    def derived_dict(self) -> dict[str, Any]:
        """Everything lmspec derived, as plain data: what `explain --format json` adds to the spec."""
        return {
            "layout": _plain(dataclasses.asdict(self.layout)),
            "batch": dataclasses.asdict(self.batch),
            "params": params_dict(self.params),
            "memory": memory_dict(self.memory),
            "flops": flops_dict(self.flops),
            "serve": serve_dict(self.serving),
            "comm": comm_dict(self.comm),
        }


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def build_plan(spec: Spec, composed: Composed, warnings: list[Problem]) -> Plan:
    """Derive every number from a spec that `validate` accepted."""
    p, t = spec.parallel, spec.train
    dims = ParallelDims.from_spec(spec)
    assert dims is not None, "validate() guarantees a legal layout"
    layout = Layout(
        world_size=dims.world,
        nodes=dims.nodes,
        gpus_per_node=dims.gpus_per_node,
        tp=p.tp,
        pp=p.pp,
        dp=dims.dp,
        cp=p.cp,
        ep=p.ep,
        etp=p.etp,
        expert_dp=dims.expert_dp,
        stage_layers=dims.stage_layers,
        virtual_stages=p.virtual_stages,
        sequence_parallel=p.sequence_parallel,
        zero_stage=p.zero_stage,
        distributed_optimizer=p.distributed_optimizer,
    )
    batch = Batch(
        micro_batch_size=t.micro_batch_size,
        global_batch_size=t.global_batch_size,
        grad_accum_steps=dims.micro_batches,
        seq_length=t.seq_length,
        tokens_per_step=t.global_batch_size * t.seq_length,
    )
    memory = estimate_train_memory(spec)
    assert memory is not None, "validate() guarantees a legal layout"
    comm = estimate_comm(spec, memory)
    assert comm is not None, "validate() guarantees a legal layout"
    return Plan(
        lmspec_version=__version__,
        spec=spec,
        layout=layout,
        batch=batch,
        params=count_params(spec.model),
        memory=memory,
        flops=flops_summary(spec, batch.tokens_per_step, dims.world),
        serving=estimate_serve_memory(spec),
        comm=comm,
        overrides=composed.overrides,
        choices=tuple(sorted(composed.choices.items())),
        warnings=tuple(warnings),
    )
