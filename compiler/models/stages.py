"""What one pipeline stage holds and does: its parameters split by how parallelism shards them, and
the work of the slowest stage. The memory model, the communication estimate and `lmspec plan`
all take a stage's numbers from here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lmspec.compiler.models.flops import flops_breakdown, hardware_flops_per_token
from lmspec.compiler.models.params import LayerParams, ParamCounts, is_moe_layer
from lmspec.compiler.spec.sections import ModelSpec


@dataclass(frozen=True)
class StageParams:
    """Parameters of one stage (numbers, or arrays of stages in the search's tables)."""

    split: Any  # divided by TP: projections, MLPs and shared experts, embedding, output head
    replicated: Any  # kept whole on every TP rank: norms and routers
    expert: Any  # routed experts, divided by EP x ETP

    def per_gpu(self, tp: Any, ep: Any, etp: Any) -> tuple[Any, Any]:
        """(dense, routed-expert) parameters one GPU of this stage holds, before optimizer sharding."""
        return self.split / tp + self.replicated, self.expert / (ep * etp)


def stage_params(layers: Sequence[LayerParams], counts: ParamCounts, start: int, stop: int, pp: int) -> StageParams:
    """The stage holding decoder layers [start, stop) of a pp-stage pipeline; `layers` lists every
    layer's parameters. The first stage adds the embedding; the last the final norm, the output
    head (a tied head is a second copy of the embedding when pp > 1) and the MTP modules (megatron
    places them there, with their own copy of the embedding when that stage is not the first)."""
    held = layers[start:stop]
    split = sum(lp.attention + lp.dense_mlp for lp in held)
    replicated = sum(lp.attention_norms + lp.layer_norms + lp.router for lp in held)
    expert = sum(lp.routed_experts for lp in held)
    if start == 0:
        split += counts.embedding
    if stop == len(layers):
        split += counts.output_head or (counts.embedding if pp > 1 else 0)
        replicated += counts.final_norm
        if counts.mtp:
            split += counts.mtp - counts.mtp_replicated - counts.mtp_expert + (counts.embedding if pp > 1 else 0)
            replicated += counts.mtp_replicated
            expert += counts.mtp_expert
    return StageParams(split, replicated, expert)


@dataclass(frozen=True)
class StageWork:
    """Per token, the slowest stage's work: what sets a micro-batch's time on the pipeline."""

    hardware_flops: float  # its layers' hardware FLOPs (recompute included), + the output head on the last
    attention_flops: float  # core attention of the most loaded stage (the window ring attention hides in)
    layers: int  # layers of the fullest stage
    moe_layers: int  # MoE layers of the stage holding most of them


def last_stage_extra(m: ModelSpec, seq_length: int) -> float:
    """The last stage's work beyond its decoder layers, in layers: the MTP layers and every output head
    (the main one and each MTP module's), as `slowest_stage_work` prices them. pp_layout=auto gives that
    stage as many layers fewer (compiler/models/dims.py `balanced_stages`)."""
    f = flops_breakdown(m, seq_length)
    per_layer = (hardware_flops_per_token(m, seq_length, "none") - f.logits) / (m.num_layers + m.mtp_layers)
    return m.mtp_layers + f.logits / per_layer


def slowest_stage_work(m: ModelSpec, seq_length: int, stages: Sequence[int], recompute: str) -> StageWork:
    """Layers cost alike (a uniform split of the layer FLOPs, MTP layers included); the last stage adds
    the MTP layers and every output head."""
    f = flops_breakdown(m, seq_length)
    per_layer = (hardware_flops_per_token(m, seq_length, recompute) - f.logits) / (m.num_layers + m.mtp_layers)
    starts = [sum(stages[:i]) for i in range(len(stages))]
    moe = max(sum(is_moe_layer(m, j) for j in range(a, a + n)) for a, n in zip(starts, stages))
    fullest = max(stages)
    return StageWork(
        hardware_flops=max(fullest * per_layer, (stages[-1] + m.mtp_layers) * per_layer + f.logits),
        attention_flops=fullest * f.core_attention / m.num_layers,
        layers=fullest,
        moe_layers=moe,
    )
