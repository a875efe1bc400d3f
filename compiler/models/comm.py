"""Communication per optimizer step and GPU, against the links it crosses, next to compute time.

Ring collectives: an all-reduce sends 2(n-1)/n of the buffer per GPU, a reduce-scatter or an
all-gather (n-1)/n, an all-to-all (n-1)/n. Traffic per step:

- TP (Megatron): 2 all-reduces per layer in forward and 2 in backward (SP turns each into a
  reduce-scatter + all-gather of the same volume) of s x b x h activations; full recompute
  repeats the forward ones.
- DP: `dp_bytes_per_param`, the collectives each backend really runs (see there); dense
  parameters over dp x cp, routed experts over the expert-data-parallel group.
- EP: dispatch and combine all-to-alls of the top-k token copies, forward and backward.
- PP: activations forward and their gradients backward between neighbouring stages.

A group stays on the intra-node link when its span fits in one node (`ParallelDims`' spans),
else it runs at the node's NIC bandwidth shared by its GPUs. Nothing is assumed to overlap with
compute (the step-time model's compute term: its GEMM efficiency by shape), so this is an upper
bound: it flags layouts where communication is large (the seed's TP8 slowdown), it does not
predict step time (`steptime.py` does, from the same volumes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lmspec.compiler.models.dims import ParallelDims
from lmspec.compiler.models.params import count_params, layer_params
from lmspec.compiler.models.stages import slowest_stage_work, stage_params
from lmspec.compiler.models.train_memory import TrainMemory
from lmspec.compiler.models.units import BITS_PER_BYTE, FP32_BYTES, GB, precision_bytes
from lmspec.compiler.spec.sections import HardwareSpec, TrainingSpec

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


def pick(condition: Any, if_true: Any, if_false: Any) -> Any:
    """`if_true if condition else if_false`, for a bool or an array of them."""
    return if_false + condition * (if_true - if_false)


@dataclass(frozen=True)
class Links:
    """Bytes/s one GPU moves inside its node and towards other nodes."""

    intra_bytes_per_s: float
    inter_bytes_per_s: float

    def ring_bytes_per_s(self, dims: ParallelDims, span: Any) -> Any:
        """Per-GPU bandwidth of a group covering `span` consecutive ranks."""
        return pick(dims.spans_nodes(span), self.inter_bytes_per_s, self.intra_bytes_per_s)


def datasheet_links(hw: HardwareSpec) -> Links:
    """The links as the datasheet states them; the NICs of a node are shared by its GPUs."""
    nic_gb_s = hw.inter_node.gbit_per_s_per_nic * hw.inter_node.nics_per_node / BITS_PER_BYTE
    return Links(hw.intra_node.gb_per_s * GB, nic_gb_s / hw.gpus_per_node * GB)


def ring(n: Any) -> Any:
    """Share of a buffer each of n ranks sends in a reduce-scatter, all-gather or all-to-all (0 at n = 1).

    This and the volume functions below are plain arithmetic on ints or numpy arrays: `lmspec plan`
    prices its candidates' traffic with them (compiler/models/steptime.py)."""
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


def dp_grad_bytes(deepspeed: Any, precision: str) -> Any:
    """Bytes per gradient element on the wire: Megatron reduces its fp32 main gradients (lmspec's
    trainer sets `grad_reduce_in_fp32` under bf16/fp16); DeepSpeed reduces in its
    `communication_data_type`, which defaults to the model's dtype."""
    return pick(deepspeed, precision_bytes(precision), FP32_BYTES)


def dp_bytes_per_param(
    zero_stage: Any, distributed_optimizer: Any, grad_bytes: Any, param_bytes: Any
) -> tuple[Any, Any]:
    """(bytes sent once per step, bytes sent every micro-batch) per parameter, in units of one
    reduce-scatter or all-gather ring share (n-1)/n, for the collectives each sharding runs:

    - unsharded (Megatron DDP, DeepSpeed ZeRO-0): one all-reduce of the gradients per step
      (2 x grad bytes; Megatron bf16: 2 x 4 = 8). No weights travel: every rank updates all of them.
    - Megatron distributed optimizer, ZeRO-1: a reduce-scatter of the gradients, then an
      all-gather of the updated weights, once per step (grad + param bytes; Megatron bf16: 4 + 2 = 6).
    - ZeRO-2: gradients are reduce-scattered in backward on every micro-batch (its partitioned
      buffers hold no full gradients to accumulate in), weights all-gathered once after the step.
    - ZeRO-3: every micro-batch gathers the weights for forward and again for backward and
      reduce-scatters the gradients (grad + 2 x param bytes); nothing is left for the step.
    """
    sharded = (distributed_optimizer != 0) | (zero_stage > 0)
    zero2, zero3 = zero_stage == 2, zero_stage == 3
    once = pick(zero3, 0, pick(zero2, param_bytes, pick(sharded, grad_bytes + param_bytes, 2 * grad_bytes)))
    every = pick(zero2, grad_bytes, pick(zero3, grad_bytes + 2 * param_bytes, 0))
    return once, every


def dp_seconds_per_byte(dims: ParallelDims, dense_params: Any, expert_params: Any, links: Links) -> Any:
    """Seconds of one reduce-scatter (or all-gather) of one byte per parameter a GPU holds: dense
    parameters over dp x cp (Megatron's data-parallel group with context parallel), routed experts
    over the expert-data-parallel group (megatron-core gives expert parameters their own buffers on it)."""
    dense = ring(dims.dense_dp) * dense_params / links.ring_bytes_per_s(dims, dims.dense_dp_span)
    expert = ring(dims.expert_dp) * expert_params / links.ring_bytes_per_s(dims, dims.expert_dp_span)
    return dense + expert


def worst_gpu_params(spec: TrainingSpec, dims: ParallelDims, memory: TrainMemory) -> tuple[float, float]:
    """(dense, routed-expert) parameters on one GPU of the stage the memory model finds worst, unrounded:
    the parameters whose gradients the DP collectives move and whose optimizer step the GPU runs."""
    m, p = spec.model, spec.parallel
    worst = memory.worst.stage
    first = sum(dims.stage_layers[:worst])
    layers = [layer_params(m, i) for i in range(m.num_layers)]
    stage = stage_params(layers, count_params(m), first, first + dims.stage_layers[worst], p.pp)
    dense, expert = stage.per_gpu(p.tp, p.ep, p.etp)
    return float(dense), float(expert)


def estimate_comm(spec: TrainingSpec, memory: TrainMemory, compute_s: float) -> CommEstimate | None:
    """Per step, on the GPU the memory model finds worst (`memory`): its stage's parameters travel in DP;
    `compute_s` is the step-time model's compute term (steptime.estimate_comm_and_step pairs them)."""
    dims = ParallelDims.from_spec(spec)
    if dims is None:
        return None
    m, p, t = spec.model, spec.parallel, spec.train
    e = precision_bytes(t.precision)
    links = datasheet_links(spec.hardware)
    micro = dims.micro_batches
    tokens = t.seq_length // p.cp * t.micro_batch_size  # per micro-batch on one GPU's sequence shard
    work = slowest_stage_work(m, t.seq_length, dims.stage_layers, t.recompute)
    # TP: 4 collectives per layer per micro-batch (6 with full recompute), each ~ an all-reduce
    tp_bytes = micro * tp_bytes_per_micro_batch(work.layers, t.recompute == "full", p.tp, tokens, m.hidden_size, e)
    tp_s = tp_bytes / links.ring_bytes_per_s(dims, dims.tp_span) if p.tp > 1 else 0.0
    # DP: gradients (and weights, when sharded) of the parameters one GPU holds
    dense, expert = worst_gpu_params(spec, dims, memory)
    grad_bytes = dp_grad_bytes(t.backend == "deepspeed", t.precision)
    once, every = dp_bytes_per_param(p.zero_stage, p.distributed_optimizer, grad_bytes, e)
    dp_s = (once + micro * every) * dp_seconds_per_byte(dims, dense, expert, links)
    # EP: 4 all-to-alls per MoE layer per micro-batch of the top-k token copies
    top_k = m.moe.top_k if m.moe else 0
    tp_split = p.tp if p.sequence_parallel else 1
    ep_bytes = micro * ep_bytes_per_micro_batch(work.moe_layers, p.ep, tokens, tp_split, top_k, m.hidden_size, e)
    ep_s = ep_bytes / links.ring_bytes_per_s(dims, dims.ep_span) if p.ep > 1 else 0.0
    # PP: one activation forward and one gradient backward per micro-batch and stage boundary
    pp_bytes = micro * pp_bytes_per_micro_batch(tokens, tp_split, m.hidden_size, e)
    pp_s = pp_bytes / links.ring_bytes_per_s(dims, dims.pp_span) if p.pp > 1 else 0.0
    return CommEstimate(tp_s=tp_s, dp_s=dp_s, ep_s=ep_s, pp_s=pp_s, compute_s=compute_s)
