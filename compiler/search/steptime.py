"""Estimated time of one training step: compute at an efficiency curve, plus exposed communication.

Plain arithmetic (no numpy import) that works on floats and numpy arrays alike, so one formula prices one
layout or a million. Per micro-batch, the slowest pipeline stage runs its layers'
hardware FLOPs (recompute included) at `gemm_efficiency` of the dense peak, plus the
tensor-parallel collectives, the expert all-to-alls, ring-attention traffic not hidden
behind attention, and the stage-to-stage send/recv. 1F1B runs (m + pp - 1) of those per
step (m micro-batches per data-parallel rank: the bubble). Then the data-parallel
gradient/parameter traffic not hidden behind backward/forward, and the optimizer update.

Overlap assumptions (the settings lmspec's emitted Megatron/DeepSpeed configs use):
- TP collectives are on the critical path (no TP/GEMM overlap): TP_COMM_EXPOSED_FRACTION.
- Expert all-to-alls are on the critical path (Megatron's alltoall dispatcher without
  DeepSeek's DualPipe overlap): EP_A2A_EXPOSED_FRACTION.
- Ring-attention (CP) traffic hides behind the core-attention compute of the same layer.
- DP traffic issued once per step (Megatron overlap_grad_reduce / overlap_param_gather,
  DeepSpeed ZeRO-0/1) hides behind DP_OVERLAP_FRACTION of one micro-batch's compute;
  traffic issued every micro-batch (ZeRO-2 reduce-scatter, ZeRO-3 gathers) behind that
  fraction of all the compute.
- Pipeline send/recv is exposed (it is small next to the layers' work).
The TP, EP and PP bytes on the wire are `lmspec.compiler.models.comm`'s volume functions (the
estimate plan.json reports, which assumes no overlap and datasheet bandwidths); here they
move at NCCL bus bandwidth, and the DP traffic follows each sharding's schedule. Rings
send 2(n-1)/n x bytes for an all-reduce, (n-1)/n x bytes for reduce-scatter / all-gather,
over the NVLink of a node when the group stays inside one, else over the node's NICs
shared by its GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lmspec.compiler.models.comm import ep_bytes_per_micro_batch, pp_bytes_per_micro_batch, tp_bytes_per_micro_batch

# --- efficiency curve (fitted to Megatron's published MFU, see tests/plan) ---
# Fraction of the dense bf16 peak the transformer's GEMMs (and the fused kernels around them)
# sustain on large, well-shaped work: cuBLAS reaches ~0.8 of peak on big bf16 GEMMs (a measured
# H200 here: 790 of 989 TFLOP/s); norms, softmax and launch gaps take the rest.
GEMM_PEAK_FRACTION = 0.84
# Per-GPU GEMM width (hidden / tp) and rows (micro_batch x seq / cp) at which efficiency is half
# its plateau, on the GPU the curve was fitted on (A100: 312 TFLOP/s over 2039 GB/s). Narrow or
# short GEMMs leave tensor cores waiting on memory; a GPU with more FLOPs per byte of HBM needs
# proportionally larger GEMMs to saturate (roofline), so both scale with its FLOP/byte balance.
GEMM_HALF_WIDTH = 384
GEMM_HALF_TOKENS = 128
REFERENCE_FLOPS_PER_BYTE = 312e12 / 2039e9
# HuggingFace modeling code under DeepSpeed runs unfused norms, rotary and SwiGLU kernels.
UNFUSED_KERNEL_FACTOR = 0.85

# --- links ---
# Datasheet NVLink figures add both directions; a ring sends one way at a time on each link.
LINK_DIRECTION_FRACTION = {"nvlink": 0.5, "pcie": 1.0, "shm": 1.0}
# NCCL bus bandwidth over link bandwidth (nccl-tests: ~230 of 300 GB/s per direction on A100
# NVLink, ~40 of 50 GB/s per 400G NIC).
INTRA_NODE_BUS_EFFICIENCY = 0.8
INTER_NODE_BUS_EFFICIENCY = 0.8
GB = 1e9
GBIT = 1e9 / 8  # bytes per second of one Gbit/s

# --- overlap and bytes on the wire ---
DP_OVERLAP_FRACTION = 0.8  # of the overlappable compute that DP traffic may hide behind
TP_COMM_EXPOSED_FRACTION = 1.0  # TP collectives on the critical path (no TP/GEMM overlap)
# Expert all-to-alls on the critical path: Megatron's alltoall dispatcher does not overlap them;
# DeepSeek's DualPipe hides them behind compute (0.0 reproduces its published GPU hours).
EP_A2A_EXPOSED_FRACTION = 1.0
ACTIVATION_BYTES = 2  # bf16 activations crossing TP, EP, CP and PP links
MEGATRON_GRAD_BYTES = 4  # Megatron reduces fp32 main gradients
DEEPSPEED_GRAD_BYTES = 2  # DeepSpeed reduces 16-bit gradients (communication_data_type = model dtype)
PARAM_GATHER_BYTES = 2  # sharded weights are gathered in bf16
# Optimizer update, bytes touched per parameter in the GPU's shard: read+write fp32 master,
# Adam m and v (24), read the fp32 gradient (4), write the bf16 weight (2).
OPTIMIZER_BYTES_PER_PARAM = 30
HBM_EFFICIENCY = 0.8  # of the datasheet HBM bandwidth an elementwise update reaches


@dataclass(frozen=True)
class Links:
    """Bus bandwidths in bytes/s a GPU sees inside its node and towards other nodes."""

    intra_bytes_per_s: float
    inter_bytes_per_s: float
    gpus_per_node: int


def _pick(condition: Any, if_true: Any, if_false: Any) -> Any:
    """`if_true if condition else if_false`, for a bool or an array of them."""
    return if_false + condition * (if_true - if_false)


def _max(a: Any, b: Any) -> Any:
    return (a + b + abs(a - b)) / 2


def _min(a: Any, b: Any) -> Any:
    return (a + b - abs(a - b)) / 2


def links(hardware: Any) -> Links:
    intra = (
        hardware.intra_node.gb_per_s
        * GB
        * LINK_DIRECTION_FRACTION[hardware.intra_node.link]
        * INTRA_NODE_BUS_EFFICIENCY
    )
    inter = (
        hardware.inter_node.nics_per_node
        * hardware.inter_node.gbit_per_s_per_nic
        * GBIT
        / hardware.gpus_per_node
        * INTER_NODE_BUS_EFFICIENCY
    )
    return Links(intra, inter, hardware.gpus_per_node)


def _ring_bw(link: Links, span: Any) -> Any:
    """Bus bandwidth of a ring whose consecutive members sit `span` ranks apart in total."""
    return _pick(span > link.gpus_per_node, link.inter_bytes_per_s, link.intra_bytes_per_s)


def gemm_efficiency(hidden: int, tp: Any, tokens: Any, flops_per_byte: float) -> Any:
    """Fraction of peak reached at a per-GPU GEMM width hidden/tp and `tokens` rows."""
    width = hidden / tp
    scale = flops_per_byte / REFERENCE_FLOPS_PER_BYTE
    return GEMM_PEAK_FRACTION * width / (width + GEMM_HALF_WIDTH * scale) * tokens / (tokens + GEMM_HALF_TOKENS * scale)


@dataclass(frozen=True, kw_only=True)
class StepInputs:
    """Per candidate (scalars or arrays): the layout, and the work and state of its slowest stage."""

    world: Any
    tp: Any
    pp: Any
    cp: Any
    ep: Any
    dp: Any
    etp: Any
    micro_batches: Any  # per DP rank per step (grad accumulation)
    tokens_per_micro_batch: Any  # micro_batch_size x seq_length (one DP rank, before cp)
    sequence_parallel: Any
    deepspeed: Any  # 1 for the DeepSpeed backend, 0 for Megatron
    zero_stage: Any
    distributed_optimizer: Any
    full_recompute: Any
    stage_flops_per_token: Any  # hardware FLOPs of the slowest stage's layers (+ head), per token
    attention_flops_per_token: Any  # core attention of those layers (the CP overlap window)
    stage_layers: Any  # layers on the slowest stage
    stage_moe_layers: Any  # of which MoE
    dense_params: Any  # non-expert parameters on one GPU of the largest stage
    expert_params: Any  # routed-expert parameters on that GPU


@dataclass(frozen=True, kw_only=True)
class StepTime:
    """Seconds per step, by term (arrays when the inputs are)."""

    compute: Any
    tp_comm: Any
    ep_comm: Any
    cp_comm: Any
    pp_comm: Any
    bubble: Any
    dp_comm: Any
    optimizer: Any

    @property
    def total(self) -> Any:
        return (
            self.compute
            + self.tp_comm
            + self.ep_comm
            + self.cp_comm
            + self.pp_comm
            + self.bubble
            + self.dp_comm
            + self.optimizer
        )

    @property
    def comm(self) -> Any:
        return self.tp_comm + self.ep_comm + self.cp_comm + self.pp_comm + self.dp_comm


def step_time(
    x: StepInputs, *, hidden: int, top_k: int, peak_flops: float, hbm_bytes_per_s: float, link: Links
) -> StepTime:
    """Seconds per training step of each candidate, split by term."""
    m = x.micro_batches
    tokens_rank = x.tokens_per_micro_batch / x.cp  # rows of every GEMM on one GPU
    efficiency = gemm_efficiency(hidden, x.tp, tokens_rank, peak_flops / hbm_bytes_per_s) * _pick(
        x.deepspeed, UNFUSED_KERNEL_FACTOR, 1.0
    )
    flops_gpu = x.tokens_per_micro_batch * x.stage_flops_per_token / (x.tp * x.cp)
    compute_mb = flops_gpu / (peak_flops * efficiency)

    # bytes on the wire per micro-batch: lmspec.compiler.models.comm's volumes, the ones plan.json reports
    tp_split = _pick(x.sequence_parallel, x.tp, 1)
    tp_bytes = tp_bytes_per_micro_batch(x.stage_layers, x.full_recompute, x.tp, tokens_rank, hidden, ACTIVATION_BYTES)
    tp_mb = TP_COMM_EXPOSED_FRACTION * tp_bytes / link.intra_bytes_per_s

    # an all-to-all sends to every peer at once: the peers in the node over NVLink, the rest over the NICs
    ep_bytes = ep_bytes_per_micro_batch(
        x.stage_moe_layers, x.ep, tokens_rank, tp_split, top_k, hidden, ACTIVATION_BYTES
    )
    in_node = _min(x.ep, link.gpus_per_node / x.etp)
    peers = _max(x.ep - 1, 1)
    ep_mb = (
        EP_A2A_EXPOSED_FRACTION
        * ep_bytes
        * _max((in_node - 1) / peers / link.intra_bytes_per_s, (x.ep - in_node) / peers / link.inter_bytes_per_s)
    )
    activation = tokens_rank * hidden * ACTIVATION_BYTES  # one micro-batch's hidden states on a TP group

    # ring attention: K and V (taken at the hidden width, as MHA; GQA sends less) of every other
    # CP rank pass once forward and twice backward (K/V again, then dK/dV)
    kv = 2 * activation / x.tp
    cp_traffic = x.stage_layers * 3 * (x.cp - 1) * kv / _ring_bw(link, x.tp * x.cp)
    attention_s = x.tokens_per_micro_batch * x.attention_flops_per_token / (x.tp * x.cp) / (peak_flops * efficiency)
    cp_mb = _max(cp_traffic - attention_s, 0.0)

    stage_span = x.world / x.pp  # ranks between neighbouring stages
    p2p = (x.pp > 1) * pp_bytes_per_micro_batch(tokens_rank, tp_split, hidden, ACTIVATION_BYTES)
    pp_mb = p2p / _ring_bw(link, stage_span + 1)

    dp_comm = _dp_exposed(x, link, compute_mb)
    sharded = x.distributed_optimizer | (x.zero_stage > 0)  # each rank updates its shard only
    local = x.dense_params / _pick(sharded, x.dp * x.cp, 1) + x.expert_params / _pick(
        sharded, x.world / (x.ep * x.etp * x.pp), 1
    )
    update_bytes = local * OPTIMIZER_BYTES_PER_PARAM
    optimizer = update_bytes / (hbm_bytes_per_s * HBM_EFFICIENCY)
    bubble = (x.pp - 1) * (compute_mb + tp_mb + ep_mb + cp_mb + pp_mb)
    return StepTime(
        compute=m * compute_mb,
        tp_comm=m * tp_mb,
        ep_comm=m * ep_mb,
        cp_comm=m * cp_mb,
        pp_comm=m * pp_mb,
        bubble=bubble,
        dp_comm=dp_comm,
        optimizer=optimizer,
    )


def _dp_exposed(x: StepInputs, link: Links, compute_mb: Any) -> Any:
    """DP gradient/parameter traffic not hidden behind compute, per step."""
    d = x.dp * x.cp  # dense gradients are reduced over DP x CP
    edp = x.world / (x.ep * x.etp * x.pp)  # expert gradients over the expert-data-parallel group
    # seconds of one reduce-scatter (or all-gather) of every local parameter at one byte each
    per_byte = (d - 1) / d * x.dense_params / _ring_bw(link, x.tp * d) + (edp - 1) / edp * x.expert_params / _ring_bw(
        link, x.ep * x.etp * edp
    )
    grad = _pick(x.deepspeed, DEEPSPEED_GRAD_BYTES, MEGATRON_GRAD_BYTES)
    gather = PARAM_GATHER_BYTES
    sharded = x.distributed_optimizer | (x.zero_stage > 0)
    # bytes per parameter sent once per step, and every micro-batch
    once = _pick(x.zero_stage == 3, 0, _pick(x.zero_stage == 2, gather, _pick(sharded, grad + gather, 2 * grad)))
    every = _pick(x.zero_stage == 2, grad, _pick(x.zero_stage == 3, grad + 2 * gather, 0))
    hidden_by = DP_OVERLAP_FRACTION * compute_mb
    return _max(once * per_byte - hidden_by, 0.0) + x.micro_batches * _max(every * per_byte - hidden_by, 0.0)
