"""Communication per optimizer step and GPU, against the links it crosses, next to compute time.

Ring collectives: an all-reduce sends 2(n-1)/n of the buffer per GPU, a reduce-scatter or an
all-gather (n-1)/n, an all-to-all (n-1)/n. Traffic per step:

- TP (Megatron): 2 all-reduces per layer in forward and 2 in backward (SP turns each into a
  reduce-scatter + all-gather of the same volume) of s x b x h activations; full recompute
  repeats the forward ones.
- DP: one gradient all-reduce per step (fp32 main gradients under Megatron, 16-bit under
  DeepSpeed); with a sharded optimizer a reduce-scatter plus an all-gather of the updated
  16-bit weights; ZeRO-3 all-gathers the weights again in forward and backward.
- EP: dispatch and combine all-to-alls of the top-k token copies, forward and backward.
- PP: activations forward and their gradients backward between neighbouring stages.

A group stays on the intra-node link when it fits in one node (Megatron orders ranks
tp, cp, ep/dp, pp), else it runs at the node's NIC bandwidth shared by its GPUs. Nothing is
assumed to overlap with compute, so this is an upper bound: it flags layouts where
communication is large (the seed's TP8 slowdown), it does not predict step time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lmspec.compiler.models.dims import data_parallel_size, stage_layers
from lmspec.compiler.models.flops import TFLOPS, hardware_flops_per_token
from lmspec.compiler.models.params import count_params, is_moe_layer, layer_params
from lmspec.compiler.spec.sections import Spec

GB = 1e9
BITS_PER_BYTE = 8
COMPUTE_EFFICIENCY = 0.5  # share of the dense peak large matmuls reach; sets compute time per step
COMM_SHARE_WARNING = 0.30  # the seed: communication above 30% of compute time is where TP stops paying


@dataclass(frozen=True, kw_only=True)
class CommEstimate:
    tp_s: float
    dp_s: float
    ep_s: float
    pp_s: float
    compute_s: float

    @property
    def total_s(self) -> float:
        return self.tp_s + self.dp_s + self.ep_s + self.pp_s

    @property
    def ratio_to_compute(self) -> float:
        return self.total_s / self.compute_s if self.compute_s else 0.0

    @property
    def share_of_step(self) -> float:
        """Communication over (compute + communication): the step time with nothing overlapped."""
        step = self.compute_s + self.total_s
        return self.total_s / step if step else 0.0


def _bandwidth_gb_s(spec: Spec, group_span: int) -> float:
    """Per-GPU bandwidth of a group spanning `group_span` consecutive ranks."""
    hw = spec.hardware
    if group_span <= hw.gpus_per_node:
        return hw.intra_node.gb_per_s
    nic_gb_s = hw.inter_node.gbit_per_s_per_nic * hw.inter_node.nics_per_node / BITS_PER_BYTE
    return nic_gb_s / hw.gpus_per_node


def ring(n: Any) -> Any:
    """Share of a buffer each of n ranks sends in a reduce-scatter, all-gather or all-to-all (0 at n = 1).

    This and the volume functions below are plain arithmetic on ints or numpy arrays: `lmspec plan`
    prices its candidates' traffic with them (compiler/search/steptime.py)."""
    return (n - 1) / n


def tp_bytes_per_micro_batch(
    layers: Any, full_recompute: Any, tp: Any, tokens: Any, hidden: int, element_bytes: int
) -> Any:
    """TP: 4 collectives per layer (6 with full recompute), each ~ an all-reduce of tokens x hidden."""
    return layers * (4 + 2 * full_recompute) * 2 * ring(tp) * tokens * hidden * element_bytes


def ep_bytes_per_micro_batch(
    moe_layers: Any, ep: Any, tokens: Any, tp_split: Any, top_k: int, hidden: int, element_bytes: int
) -> Any:
    """EP: dispatch and combine all-to-alls, forward and backward, of the top-k token copies."""
    return moe_layers * 4 * ring(ep) * tokens / tp_split * top_k * hidden * element_bytes


def pp_bytes_per_micro_batch(tokens: Any, tp_split: Any, hidden: int, element_bytes: int) -> Any:
    """PP: one activation forward and one gradient backward per stage boundary."""
    return 2 * tokens * hidden * element_bytes / tp_split


def estimate_comm(spec: Spec) -> CommEstimate | None:
    dp, stages = data_parallel_size(spec), stage_layers(spec)
    if dp is None or stages is None:
        return None
    m, p, t = spec.model, spec.parallel, spec.train
    e = 4 if t.precision == "fp32" else 2
    micro = max(t.global_batch_size // (t.micro_batch_size * dp), 1)
    tokens = t.seq_length // p.cp * t.micro_batch_size  # per micro-batch on one GPU's sequence shard
    layers = max(stages)
    # TP: 4 collectives per layer per micro-batch (6 with full recompute), each ~ an all-reduce
    tp_bytes = micro * tp_bytes_per_micro_batch(layers, t.recompute == "full", p.tp, tokens, m.hidden_size, e)
    tp_s = tp_bytes / (_bandwidth_gb_s(spec, p.tp) * GB) if p.tp > 1 else 0.0
    # DP: gradients of the parameters one GPU holds
    first = sum(stages[: stages.index(layers)])
    held = [layer_params(m, i) for i in range(first, first + layers)]
    dense = sum((lp.attention + lp.dense_mlp) / p.tp + lp.attention_norms + lp.layer_norms + lp.router for lp in held)
    dense += count_params(m).embedding / p.tp if stages.index(layers) == 0 else 0
    expert = sum(lp.routed_experts for lp in held) / (p.ep * p.etp)
    grad_e = 4 if t.backend == "megatron" else e
    sharded = p.distributed_optimizer or (t.backend == "deepspeed" and p.zero_stage >= 1)
    per_param = (grad_e + e) * (1 if sharded else 2)  # reduce-scatter + all-gather, or all-reduce of grads
    if t.backend == "deepspeed" and p.zero_stage == 3:
        per_param += 2 * e  # weights gathered for forward and again for backward
    expert_dp = max(spec.hardware.gpus_per_node * spec.hardware.nodes // (p.etp * p.ep * p.pp), 1)
    dp_s = dense * per_param * ring(dp * p.cp) / (
        _bandwidth_gb_s(spec, p.tp * p.cp * dp) * GB
    ) + expert * per_param * ring(expert_dp) / (_bandwidth_gb_s(spec, p.tp * p.cp * dp) * GB)
    # EP: 4 all-to-alls per MoE layer per micro-batch of the top-k token copies
    moe_layers = sum(is_moe_layer(m, i) for i in range(first, first + layers))
    top_k = m.moe.top_k if m.moe else 0
    tp_split = p.tp if p.sequence_parallel else 1
    ep_bytes = micro * ep_bytes_per_micro_batch(moe_layers, p.ep, tokens, tp_split, top_k, m.hidden_size, e)
    ep_s = ep_bytes / (_bandwidth_gb_s(spec, p.tp * p.ep) * GB) if p.ep > 1 else 0.0
    # PP: one activation forward and one gradient backward per micro-batch and stage boundary
    pp_bytes = micro * pp_bytes_per_micro_batch(tokens, tp_split, m.hidden_size, e)
    pp_s = pp_bytes / (_bandwidth_gb_s(spec, p.tp * p.cp * dp * p.pp) * GB) if p.pp > 1 else 0.0
    world = spec.hardware.gpus_per_node * spec.hardware.nodes
    flops = hardware_flops_per_token(m, t.seq_length, t.recompute) * t.global_batch_size * t.seq_length / world
    compute_s = flops / (spec.hardware.gpu.bf16_tflops * TFLOPS * COMPUTE_EFFICIENCY)
    return CommEstimate(tp_s=tp_s, dp_s=dp_s, ep_s=ep_s, pp_s=pp_s, compute_s=compute_s)
