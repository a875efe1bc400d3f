"""The communication of one training step that compute does not hide, by parallel dimension.

The part of the step-time model (compiler/models/steptime.py) that turns each dimension's volume
(compiler/models/comm.py, at NCCL bus bandwidth: steptime_inputs.py `bus_links`) into seconds, and decides
how much of it overlaps the compute of steptime_compute.py. Plain arithmetic on floats and numpy arrays.

- TP collectives are on the critical path, unless `parallel.overlap.tp_comm` pipelines them with the GEMMs
  (Transformer Engine's userbuffers, with sequence parallelism): then the calibrated share stays exposed.
- Expert dispatch and combine (compiler/models/moe_dispatch.py, per train.moe.dispatcher) are on the
  critical path, at the pace of the EP rank that receives the most copies (compiler/models/moe_load.py),
  unless `parallel.overlap.moe_a2a`: then one micro-batch's all-to-alls hide behind another's compute
  (megatron-core's combined 1F1B, DeepSeek-V3's DualPipe), all but the step's unpaired first forward and
  last backward (1/m of them); or `train.moe.shared_expert_overlap`: then they hide behind the same
  layer's shared-expert GEMMs. Hidden, they still hold the SMs their kernels run on (`overlapped`).
- Ring attention (CP) passes the K and V heads (the KV width, not the hidden: GQA sends kv_heads/heads of it)
  of every other CP rank once forward and twice backward, hidden behind the core attention of the same layer.
- Pipeline send/recv is exposed once per micro-batch (interleaved chunks' extra sends overlap: Megatron's
  overlap_p2p_comm).
- DP: the gradient reduce after the last micro-batch's backward hides behind that backward with
  `parallel.overlap.grad_reduce`, the sharded weights' all-gather behind the next first forward with
  `parallel.overlap.param_gather` (Megatron's distributed optimizer; DeepSpeed ZeRO-1/2 gather after the step
  and ZeRO-0 reduces after the backward, unhidden); ZeRO-2/3 traffic of every micro-batch hides behind each
  micro-batch's compute. A bucketed reduce hides behind DP_OVERLAP_FRACTION of its window (the last bucket
  waits for the last gradients).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lmspec.compiler.models import larger, pick, smaller
from lmspec.compiler.models.comm import (
    dp_seconds_per_byte,
    dp_traffic,
    pp_bytes_per_micro_batch,
    tp_bytes_per_micro_batch,
)
from lmspec.compiler.models.moe_dispatch import dispatch_bytes, expert_tp_bytes
from lmspec.compiler.models.steptime_calibration import Calibration
from lmspec.compiler.models.steptime_compute import MicroBatchCompute
from lmspec.compiler.models.steptime_inputs import StepConstants, StepInputs

DP_OVERLAP_FRACTION = 0.8  # of its window a bucketed DP collective hides behind
# The communication kernels of an overlapped all-to-all occupy streaming multiprocessors the compute beside
# them loses: DeepSeek-V3 gives its dispatch and combine 20 of an H800's 132 SMs (report section 3.2.2,
# DeepEP's default Buffer.num_sms = 20).
COMM_SM_SHARE = 20 / 132


def overlapped(comm_s: Any, window_s: Any) -> Any:
    """Seconds `comm_s` of communication adds beside `window_s` of compute it overlaps: what sticks out of the
    window, and the window's compute slowed by the SMs the communication kernels hold while they run."""
    return larger(comm_s - window_s, 0.0) + smaller(comm_s, window_s) * COMM_SM_SHARE


@dataclass(frozen=True, kw_only=True)
class MicroBatchComm:
    """Seconds of one micro-batch's communication per dimension: all of it, and what stays exposed."""

    tp: Any
    tp_exposed: Any
    ep: Any
    ep_exposed: Any
    cp: Any
    cp_exposed: Any
    pp: Any  # exposed whole


def micro_batch_comm(
    x: StepInputs, c: StepConstants, cal: Calibration, rows: Any, tp_split: Any, compute: MicroBatchCompute
) -> MicroBatchComm:
    """TP, EP, CP and PP communication of one micro-batch on one GPU of the slowest stage, beside that
    micro-batch's `compute` (steptime_compute.py `micro_batch_compute`, with the same `rows`, `tp_split`)."""
    compute_s, attention_s = compute.total, compute.attention
    shared_expert_s, imbalance = compute.shared_experts, compute.imbalance
    d = x.dims
    tp_bytes = tp_bytes_per_micro_batch(x.stage_layers, x.full_recompute, d.tp, rows, c.hidden, x.element_bytes)
    tp_mb = tp_bytes / c.link.intra_for(d.tp)
    tp_overlapped = c.overlap_tp_comm * x.sequence_parallel * (d.tp > 1)
    tp_exposed = tp_mb * pick(tp_overlapped, cal.tp_overlap_exposed, 1.0)

    # the dispatcher's bytes (moe_dispatch.py): NVLink and NIC legs run at once, the slowest EP rank receives
    # `imbalance` times the mean (moe_load.py)
    link = c.link
    in_node = smaller(d.ep, d.domain_gpus / d.etp)  # EP peers inside the NVLink domain
    sent = dispatch_bytes(
        c.dispatcher,
        d.ep,
        in_node,
        rows / tp_split,
        c.top_k,
        c.hidden,
        x.element_bytes,
        c.route_groups,
        c.route_group_topk,
    )
    if c.dispatcher == "allgather":  # ring collectives over the EP group
        per_layer = (sent.intra + sent.inter) / link.ring_bytes_per_s(d, d.ep_span, d.etp)
    else:
        per_layer = larger(sent.intra / link.intra_for(in_node), sent.inter / link.inter_bytes_per_s)
    # experts split by expert tensor parallelism: the ETP group all-gathers the copies each rank received
    # and reduce-scatters the experts' outputs, forward and backward (megatron's tp_ep dispatch), on NVLink
    received = rows / tp_split * c.top_k * c.hidden * x.element_bytes
    per_layer = per_layer + expert_tp_bytes(d.etp, received) / link.intra_for(d.etp)
    ep_mb = x.stage_moe_layers * per_layer * imbalance
    # megatron-core hides the all-to-alls behind another micro-batch's compute (moe_a2a: the combined 1F1B
    # pairs one micro-batch's forward with another's backward, so the first forward and the last backward of
    # a step's m micro-batches run unpaired: 1/m of them stays exposed), or behind the shared experts' GEMMs
    # of the same layer (moe_shared_expert_overlap)
    beside_shared = pick(c.shared_expert_overlap, overlapped(ep_mb, shared_expert_s), ep_mb)
    unpaired = 1 / d.micro_batches
    beside_another = unpaired * ep_mb + overlapped((1 - unpaired) * ep_mb, compute_s)
    ep_exposed = pick(x.moe_a2a, beside_another, beside_shared)

    # ring attention: the K and V of every other CP rank pass once forward and twice backward (K/V, then dK/dV)
    kv = rows * c.kv_width / d.tp * x.element_bytes
    cp_mb = x.stage_layers * 3 * (d.cp - 1) * kv / link.ring_bytes_per_s(d, d.cp_span, d.tp)
    cp_exposed = larger(cp_mb - attention_s, 0.0)

    p2p = (d.pp > 1) * pp_bytes_per_micro_batch(rows, tp_split, c.hidden, x.element_bytes)
    pp_mb = p2p / link.ring_bytes_per_s(d, d.pp_span, d.world // d.pp)
    return MicroBatchComm(
        tp=tp_mb, tp_exposed=tp_exposed, ep=ep_mb, ep_exposed=ep_exposed, cp=cp_mb, cp_exposed=cp_exposed, pp=pp_mb
    )


def dp_comm(x: StepInputs, c: StepConstants, compute_s: Any) -> tuple[Any, Any]:
    """(DP gradient/parameter traffic per step left exposed after overlap, and all of it), beside one
    micro-batch's `compute_s`."""
    per_byte = dp_seconds_per_byte(x.dims, x.dense_params, x.expert_params, c.link)
    t = dp_traffic(x.zero_stage, x.distributed_optimizer, x.grad_bytes, x.element_bytes, x.reduces_every_micro_batch)
    forward = compute_s / (3 + x.full_recompute)  # a backward is twice its forward (+ the recomputed forward)
    backward = compute_s - forward
    unoverlapped_reduce = x.reduces_after_backward * (x.zero_stage == 0)
    reduce_window = c.overlap_grad_reduce * (1 - unoverlapped_reduce) * backward
    gather_window = c.overlap_param_gather * (1 - x.gathers_after_step) * forward
    every_window = compute_s * pick(x.zero_stage == 3, c.overlap_param_gather, c.overlap_grad_reduce)
    exposed = (
        larger(t.reduce * per_byte - DP_OVERLAP_FRACTION * reduce_window, 0.0)
        + larger(t.gather * per_byte - DP_OVERLAP_FRACTION * gather_window, 0.0)
        + x.dims.micro_batches * larger(t.every * per_byte - DP_OVERLAP_FRACTION * every_window, 0.0)
    )
    return exposed, (t.reduce + t.gather + x.dims.micro_batches * t.every) * per_byte
