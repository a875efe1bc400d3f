"""The layout space and its enumeration, stage by stage, keeping only what is legal.

The raw space is the product of every axis below. It is never materialised: each
stage adds its axes to the survivors of the previous one and drops what a rule
rejects there, and a candidate dropped at a stage is counted once for each of its
extensions by the later axes, so the rejection counts add up to the raw space.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from lmspec.compiler.backends import BACKENDS as TRAINING_BACKENDS
from lmspec.compiler.models.dims import divisors, domain_gpus, nodes_per_domain
from lmspec.compiler.search.legality import (
    BACKEND_CHECKS,
    BACKENDS,
    BATCH_CHECKS,
    EXPERT_CHECKS,
    LAYOUT_CHECKS,
    RECOMPUTE,
    SCHEDULE_CHECKS,
    Check,
    Columns,
)
from lmspec.compiler.spec.sections import TrainingSpec

MAX_CONTEXT_PARALLEL = 16  # ring attention beyond 16 ranks is outside what the step-time model covers
# chunk counts searched whatever the split (beyond it only those that split balanced stages evenly): each count
# adds about half the plain 1F1B layouts again (bench/plan_speed.py: DeepSeek-V3's 61 layers, up to 4096 GPUs,
# 1.4 s with 4, 2.1 s with 8), and the step-time model prices v chunks as equal ((pp - 1) / v of a micro-batch
# in bubble), which an uneven split's longest chunk strays further from as v nears a stage's layers
MAX_UNEVEN_VIRTUAL_STAGES = 4
MAX_MICRO_BATCH = 16  # sequences per micro-batch; beyond this activations dominate at any length
# (backend, ZeRO stage, distributed optimizer): a backend that shards with ZeRO stages (DeepSpeed; torchtitan's
# FSDP2 strategies as ZeRO's) is searched at each stage, one with Megatron's distributed optimizer with and
# without it; what a target lacks (FSDP2 has no stage 1) the capability table refuses, as for a spec.
SHARDINGS = tuple(
    (index, stage, optimizer)
    for index, backend in enumerate(TRAINING_BACKENDS.values())
    for stage, optimizer in (
        ((0, False), (1, False), (2, False), (3, False)) if backend.zero_sharding else ((0, False), (0, True))
    )
)


def powers_of_two(limit: int) -> list[int]:
    return [2**i for i in range(int(math.log2(limit)) + 1)] if limit >= 1 else []


@dataclass(frozen=True)
class Axes:
    """Values each searched key may take; the raw space is their product."""

    nodes: tuple[int, ...]
    tp: tuple[int, ...]
    pp: tuple[int, ...]
    cp: tuple[int, ...]
    ep: tuple[int, ...]
    micro_batch_size: tuple[int, ...]
    virtual_stages: tuple[int, ...]  # model chunks per pipeline rank; 1 is plain 1F1B (parallel.virtual_stages=null)
    shardings: tuple[tuple[int, int, bool], ...]
    sequence_parallel: tuple[bool, ...] = (False, True)
    recompute: tuple[int, ...] = tuple(range(len(RECOMPUTE)))
    moe_a2a: tuple[bool, ...] = (False,)  # parallel.overlap.moe_a2a; searched (False, True) for MoE models only

    @property
    def raw_size(self) -> int:
        return math.prod(
            len(v)
            for v in (
                self.nodes,
                self.tp,
                self.pp,
                self.cp,
                self.ep,
                self.micro_batch_size,
                self.virtual_stages,
                self.shardings,
                self.sequence_parallel,
                self.recompute,
                self.moe_a2a,
            )
        )


def interleavings(num_layers: int) -> tuple[int, ...]:
    """1 (plain 1F1B) and the chunk counts searched: megatron-core takes uneven chunks (dims.chunk_layers), so
    every v from 2 to MAX_UNEVEN_VIRTUAL_STAGES, and beyond it the divisors of the layers (even chunks wherever
    pp divides the layers too); a pipeline (pp >= 2) leaves a stage at most half the layers, rounded up, and
    chunks past the longest stage's layers are empty on every stage (rules.layout.virtual_stages_have_layers)."""
    most = -(-num_layers // 2)
    uneven = range(2, min(MAX_UNEVEN_VIRTUAL_STAGES, most) + 1)
    return (1, *sorted({*uneven, *(v for v in divisors(num_layers) if 1 < v <= most)}))


def default_axes(spec: TrainingSpec, nodes: Sequence[int], backends: Sequence[str]) -> Axes:
    """Every value worth trying for this model and hardware."""
    m = spec.model
    experts = [1]
    if m.moe is not None:
        experts = sorted(
            set(powers_of_two(m.moe.num_experts))
            | {d for d in range(1, m.moe.num_experts + 1) if m.moe.num_experts % d == 0}
        )
    allowed = {BACKENDS.index(b) for b in backends}
    hw = spec.hardware
    per_domain = nodes_per_domain(hw.gpus_per_node, hw.nvlink_domain)
    widest = max(int(domain_gpus(hw.gpus_per_node, n, per_domain)) for n in nodes)  # TP stays in its domain
    return Axes(
        nodes=tuple(nodes),
        tp=tuple(range(1, widest + 1)),
        pp=tuple(range(1, m.num_layers + 1)),
        cp=tuple(powers_of_two(MAX_CONTEXT_PARALLEL)),
        ep=tuple(experts),
        micro_batch_size=tuple(powers_of_two(MAX_MICRO_BATCH)),
        virtual_stages=interleavings(m.num_layers),
        shardings=tuple(s for s in SHARDINGS if s[0] in allowed),
        moe_a2a=(False, True) if m.moe is not None else (False,),
    )


def _grid(**axes: Sequence[object]) -> dict[str, np.ndarray]:
    mesh = np.meshgrid(*[np.asarray(v) for v in axes.values()], indexing="ij")
    return {name: m.ravel() for name, m in zip(axes, mesh)}


@dataclass
class Enumeration:
    legal: Columns
    raw_size: int
    rejected: dict[str, int]  # rule -> raw candidates it rejected first


def _stage(
    columns: Columns,
    new: dict[str, np.ndarray],
    checks: Sequence[Check],
    spec: TrainingSpec,
    weight: int,
    rejected: dict[str, int],
) -> Columns:
    """Survivors x the stage's new rows, broadcast as a 2-D grid; only legal pairs are gathered."""
    grid = Columns({k: v[:, None] for k, v in columns.items()})
    grid.update({k: v[None, :] for k, v in new.items()})
    alive = np.ones((columns.size, len(next(iter(new.values())))), dtype=bool)
    for check in checks:
        ok = np.broadcast_to(np.asarray(check.passes(grid, spec), dtype=bool), alive.shape)
        rejected[check.rule] = rejected.get(check.rule, 0) + int(np.count_nonzero(alive & ~ok)) * weight
        alive &= ok
    rows, picks = np.nonzero(alive)
    out = Columns({k: v[rows] for k, v in columns.items()})
    out.update({k: v[picks] for k, v in new.items()})
    return out


def enumerate_legal(spec: TrainingSpec, axes: Axes) -> Enumeration:
    """The legal candidates, as columns, and what each rule rejected of the raw space."""
    rejected: dict[str, int] = {}
    n_ep, n_mbs, n_vp = len(axes.ep), len(axes.micro_batch_size), len(axes.virtual_stages)
    n_tail = len(axes.shardings) * len(axes.sequence_parallel) * len(axes.recompute) * len(axes.moe_a2a)
    # pp outermost: every later stage keeps row order, so the legal set stays sorted by pp
    start = Columns(pp=np.asarray(axes.pp))
    cols = _stage(
        start,
        _grid(nodes=axes.nodes, tp=axes.tp, cp=axes.cp),
        LAYOUT_CHECKS,
        spec,
        n_mbs * n_vp * n_ep * n_tail,
        rejected,
    )
    # the schedule's rule is a layout rule that reads the micro-batch count: it runs before the expert rules
    schedule = _grid(micro_batch_size=axes.micro_batch_size, virtual_stages=axes.virtual_stages)
    cols = _stage(cols, schedule, SCHEDULE_CHECKS, spec, n_ep * n_tail, rejected)
    cols = _stage(cols, {"ep": np.asarray(axes.ep)}, (*EXPERT_CHECKS, *BATCH_CHECKS), spec, n_tail, rejected)
    shard = np.asarray(axes.shardings, dtype=object)
    tail = _grid(
        sharding=range(len(axes.shardings)),
        sequence_parallel=axes.sequence_parallel,
        recompute=axes.recompute,
        moe_a2a=axes.moe_a2a,
    )
    index = tail.pop("sharding")
    tail.update(
        backend=shard[index, 0].astype(np.int64),
        zero_stage=shard[index, 1].astype(np.int64),
        distributed_optimizer=shard[index, 2].astype(bool),
    )
    cols = _stage(cols, tail, BACKEND_CHECKS, spec, 1, rejected)
    return Enumeration(legal=cols, raw_size=axes.raw_size, rejected=rejected)
