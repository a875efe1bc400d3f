"""The parallel degrees of a layout and every number that follows from them: the one owner.

`ParallelDims` plays the part of torchtitan's `ParallelDims`: world size, data-parallel and
expert-data-parallel sizes, micro-batches per step, the stage split, the device, and the
size and rank span of each communication group. The Plan, the rules, the memory and
communication models and `lmspec plan` all read them here, never as `gpus_per_node * nodes`
inline. Its fields are ints for one spec, or numpy arrays of candidates for the search:
every property and function below is plain arithmetic (no branches on values), so one
formula serves both.

Rank order is Megatron's: `tp-cp-ep-dp-pp` for the dense layers and `etp-ep-edp-pp` for the
experts (MoE parallel folding), so a group's members lie within `span` consecutive ranks and
the group stays on the intra-node link when the span fits in one NVLink domain: one node, or the
nodes of a rack that NVLink joins (hardware.nvlink_domain: GB200 NVL72's 72 GPUs on 18 hosts),
as many of them as the job fills in rank order (`segment_nodes`).

One layout passes through four named stages, each the input of the next and none re-deriving another:
`ParallelSpec` (compiler/spec/sections: what the spec asks, `dp: auto` included) -> `ParallelDims` (here:
every degree resolved and every number that follows, for one spec or a million candidates) -> the Plan's
`Layout` (compiler/plan.py: one resolved layout as plan.json records it, built from ParallelDims) ->
`ParallelDegrees` (compiler/backends/megatron_config.py: the model-parallel part a megatron-core model is
built at, the Layout's in training, or all ones for one process).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from lmspec.compiler.models import pick
from lmspec.compiler.models.stages import last_stage_extra
from lmspec.compiler.spec.sections import HardwareSpec, Spec, TrainingSpec

Device = Literal["cpu", "gpu"]


def device_kind(spec: Spec) -> Device:
    """`cpu` for the cpu hardware (ranks are processes on host cores over shared memory and gloo).

    The one reader of "is this a CPU job": hardware.intra_node.link=shm says it, and the rule
    rules.hardware.link_matches_generation holds hardware.gpu.generation=cpu to the same answer.
    """
    return "cpu" if spec.hardware.intra_node.link == "shm" else "gpu"


def world_size(gpus_per_node: Any, nodes: Any) -> Any:
    return gpus_per_node * nodes


def nodes_per_domain(gpus_per_node: int, nvlink_domain: int | None) -> int:
    """Nodes one NVLink domain joins (hardware.nvlink_domain / gpus_per_node): 1 where the domain is a
    node (null, or no larger than one; rules.hardware holds it to a multiple of gpus_per_node)."""
    return max(1, (nvlink_domain or gpus_per_node) // gpus_per_node)


def segment_nodes(nodes: Any, per_domain: int) -> Any:
    """Nodes of one NVLink domain the job's ranks fill in order: the largest divisor of `nodes` no larger
    than the domain's `per_domain` nodes, so every domain the job uses holds the same number of nodes and
    none is split (Slurm's `--segment`; 16 of an NVL72's 18 hosts for a 32-node job)."""
    best = nodes * 0 + 1
    for d in range(2, per_domain + 1):
        best = pick(nodes % d == 0, d, best)  # ascending: the largest divisor wins
    return best


def domain_gpus(gpus_per_node: int, nodes: Any, per_domain: int) -> Any:
    """GPUs of the job that reach each other over the intra-node link: a node's, or the part of an NVLink
    domain the job fills (`segment_nodes` of its nodes)."""
    return gpus_per_node * segment_nodes(nodes, per_domain)


def domain_gpus_of(hardware: HardwareSpec) -> int:
    """`domain_gpus` of the spec's own job (before its layout is known to be legal)."""
    per_domain = nodes_per_domain(hardware.gpus_per_node, hardware.nvlink_domain)
    return int(domain_gpus(hardware.gpus_per_node, hardware.nodes, per_domain))


def model_parallel_size(tp: Any, pp: Any, cp: Any) -> Any:
    return tp * pp * cp


def derived_dp(world: Any, tp: Any, pp: Any, cp: Any) -> Any:
    """dp = world / (tp x pp x cp), as `parallel.dp=auto` derives it; 0 where that does not divide."""
    mp = model_parallel_size(tp, pp, cp)
    return (world % mp == 0) * (world // mp)


def ranks_per_stage(dp: Any, tp: Any, cp: Any) -> Any:
    """Ranks of one pipeline stage, dp x tp x cp: the ranks Megatron folds EP x ETP over."""
    return dp * tp * cp


def expert_data_parallel_size(world: Any, ep: Any, etp: Any, pp: Any) -> Any:
    """Replicas of each expert shard: world / (etp x ep x pp), at least 1."""
    edp = world // (etp * ep * pp)
    return edp + (edp < 1) * (1 - edp)


def micro_batches_per_step(global_batch_size: Any, micro_batch_size: Any, dp: Any) -> Any:
    """Micro-batches each DP rank runs per optimizer step (gradient accumulation), at least 1."""
    n = global_batch_size // (micro_batch_size * dp)
    return n + (n < 1) * (1 - n)


def data_parallel_size(spec: TrainingSpec) -> int | None:
    """The spec's dp: as given, or derived for `auto`; None when that does not divide (the rules, which
    check one factor at a time, need it before the whole layout is known to be legal)."""
    p = spec.parallel
    if p.dp != "auto":
        return int(p.dp)
    dp = derived_dp(world_size(spec.hardware.gpus_per_node, spec.hardware.nodes), p.tp, p.pp, p.cp)
    return int(dp) or None


@dataclass(frozen=True, kw_only=True)
class ParallelDims:
    """Resolved degrees of one layout (ints), or of many candidates (arrays)."""

    gpus_per_node: int
    nodes: Any
    tp: Any
    pp: Any
    cp: Any
    ep: Any
    etp: Any
    dp: Any  # replicas of the dense layers; their gradients are reduced over dp x cp
    micro_batches: Any  # per DP rank per optimizer step (gradient accumulation)
    stage_layers: tuple[int, ...] = ()  # layers per pipeline stage; one spec only (the search balances them)
    device: Device = "gpu"
    nodes_per_domain: int = 1  # nodes one NVLink domain joins (`nodes_per_domain`)

    @staticmethod
    def from_spec(spec: TrainingSpec) -> ParallelDims | None:
        """The spec's degrees, or None when dp or the stage split is not legal (the rules say why)."""
        hw, p, t = spec.hardware, spec.parallel, spec.train
        dp, stages = data_parallel_size(spec), stage_layers(spec)
        if dp is None or stages is None:
            return None
        return ParallelDims(
            gpus_per_node=hw.gpus_per_node,
            nodes=hw.nodes,
            tp=p.tp,
            pp=p.pp,
            cp=p.cp,
            ep=p.ep,
            etp=p.etp,
            dp=dp,
            micro_batches=micro_batches_per_step(t.global_batch_size, t.micro_batch_size, dp),
            stage_layers=stages,
            device=device_kind(spec),
            nodes_per_domain=nodes_per_domain(hw.gpus_per_node, hw.nvlink_domain),
        )

    @property
    def world(self) -> Any:
        return world_size(self.gpus_per_node, self.nodes)

    @property
    def dense_dp(self) -> Any:
        """Ranks that reduce (and, sharded, partition) each dense parameter's gradient: dp x cp."""
        return self.dp * self.cp

    @property
    def expert_dp(self) -> Any:
        return expert_data_parallel_size(self.world, self.ep, self.etp, self.pp)

    # spans: how many consecutive ranks a group's members cover
    @property
    def tp_span(self) -> Any:
        return self.tp

    @property
    def cp_span(self) -> Any:
        return self.tp * self.cp

    @property
    def dense_dp_span(self) -> Any:
        return self.tp * self.cp * self.dp

    @property
    def ep_span(self) -> Any:
        return self.etp * self.ep

    @property
    def expert_dp_span(self) -> Any:
        return self.etp * self.ep * self.expert_dp

    @property
    def pp_span(self) -> Any:
        """Every stage boundary of a multi-node job: some neighbouring pair sits on two nodes."""
        return self.world

    @property
    def domain_gpus(self) -> Any:
        return domain_gpus(self.gpus_per_node, self.nodes, self.nodes_per_domain)

    def spans_nodes(self, span: Any) -> Any:
        """True where a group covering `span` consecutive ranks leaves its NVLink domain: wider than the
        domain, or not dividing it, so that some group straddles two domains (the slowest sets the pace)."""
        return (span > self.domain_gpus) | (self.domain_gpus % span != 0)


def balanced_stages(num_layers: int, pp: int, last_extra: float = 0.0) -> tuple[int, ...]:
    """Split layers over stages so the busiest stage does the least work. Layers cost alike; the last stage
    also runs the output head and the MTP modules, `last_extra` layers' worth of work
    (compiler/models/stages.py `last_stage_extra`), so it takes as many whole layers fewer, keeping one.
    The layers left over come off the stages from both ends inwards (0, pp-1, 1, ...): the first and last
    stages also hold the embedding and the head."""
    per_stage = -(-num_layers // pp)

    def last(m: int) -> int:  # the last stage's layers when the others take m: whole layers of extra work off
        return max(1, m - math.floor(last_extra))

    while (pp - 1) * per_stage + last(per_stage) < num_layers:
        per_stage += 1
    stages = [per_stage] * (pp - 1) + [last(per_stage)]
    # stages from both ends inwards (0, pp-1, 1, pp-2, ...): dict.fromkeys keeps the first of each, in O(pp);
    # a last stage already shortened for its head keeps what it has
    order = [i for i in dict.fromkeys(i for pair in zip(range(pp), reversed(range(pp))) for i in pair)]
    if stages[-1] < per_stage:
        order.remove(pp - 1)
    for i in order[: sum(stages) - num_layers]:
        stages[i] -= 1
    return tuple(stages)


def stage_layers(spec: TrainingSpec) -> tuple[int, ...] | None:
    """Layers on each pipeline stage, or None when the layout is not legal."""
    layers, pp, layout = spec.model.num_layers, spec.parallel.pp, spec.parallel.pp_layout
    if layout is None:
        return (layers // pp,) * pp if layers % pp == 0 else None
    if layout == "auto":
        extra = last_stage_extra(spec.model, spec.train.seq_length)
        return balanced_stages(layers, pp, extra) if layers >= pp else None
    stages = tuple(int(n) for n in layout)
    return stages if len(stages) == pp and sum(stages) == layers and min(stages) >= 1 else None


def chunk_layers(stage_layers: tuple[int, ...], virtual_stages: int | None) -> tuple[int, ...]:
    """Layers of each model chunk in Megatron's pipeline order (`pipeline_model_parallel_layout`):
    with `virtual_stages` v every stage's n layers split as evenly as possible into v chunks, the first
    n mod v chunks taking one more (Megatron-Bridge's DeepSeek-V3 layouts split 61 layers so), and chunk
    c of stage r is entry c x pp + r, so the model's layers run chunk 0 of every stage, then chunk 1, ...
    (interleaved 1F1B). A stage of fewer layers than chunks leaves its last chunks without a layer:
    megatron-core builds them as empty blocks that pass the activations on (its layout class and
    TransformerBlock allow it; rules.layout.virtual_stages_have_layers warns where every stage has one).
    Without virtual stages a stage is one chunk."""
    v = virtual_stages or 1
    return tuple(n // v + (c < n % v) for c in range(v) for n in stage_layers)


def divisors(n: int) -> list[int]:
    """Every divisor of n, ascending, found in O(sqrt n) steps."""
    small: list[int] = []
    large: list[int] = []
    d = 1
    while d * d <= n:
        if n % d == 0:
            small.append(d)
            if d != n // d:
                large.append(n // d)
        d += 1
    return small + large[::-1]


def next_multiple_above(n: int, step: int) -> int:
    """The smallest multiple of `step` greater than n."""
    return (n // step + 1) * step
