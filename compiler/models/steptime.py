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
With train.precision=fp8 the GEMMs run at hardware.gpu.fp8_tflops (their efficiency on that peak's
FLOP/byte balance) and the core attention stays bf16 (TE's fused attention computes in bf16); the core
attention recomputed by selective or full recompute is priced with the GEMMs. MFU stays quoted
against the bf16 peak (compiler/models/summary.py), as DeepSeek-V3 and Megatron report FP8 runs.
The bytes on the wire (TP, EP, PP volumes and the DP bytes per parameter of each sharding) are
`lmspec.compiler.models.comm`'s functions, the ones plan.json's estimate uses (with no overlap and
datasheet bandwidths); here they move at NCCL bus bandwidth. Rings send 2(n-1)/n x bytes for an
all-reduce, (n-1)/n x bytes for reduce-scatter / all-gather, over the NVLink of a node when the
group stays inside one (`ParallelDims`' spans), else over the node's NICs shared by its GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lmspec.compiler.models.comm import (
    CommEstimate,
    Links,
    dp_bytes_per_param,
    dp_grad_bytes,
    dp_seconds_per_byte,
    ep_bytes_per_micro_batch,
    estimate_comm,
    pick,
    pp_bytes_per_micro_batch,
    tp_bytes_per_micro_batch,
    worst_gpu_params,
)
from lmspec.compiler.models.dims import ParallelDims
from lmspec.compiler.models.stages import slowest_stage_work
from lmspec.compiler.models.train_memory import TrainMemory
from lmspec.compiler.models.units import GB, GBIT, TFLOPS, precision_bytes
from lmspec.compiler.spec.sections import TrainingSpec

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

# --- overlap and bytes on the wire ---
DP_OVERLAP_FRACTION = 0.8  # of the overlappable compute that DP traffic may hide behind
TP_COMM_EXPOSED_FRACTION = 1.0  # TP collectives on the critical path (no TP/GEMM overlap)
# Expert all-to-alls on the critical path: Megatron's alltoall dispatcher does not overlap them;
# DeepSeek's DualPipe hides them behind compute (0.0 reproduces its published GPU hours).
EP_A2A_EXPOSED_FRACTION = 1.0
# Optimizer update, bytes touched per parameter in the GPU's shard: read+write fp32 master,
# Adam m and v (24), read the fp32 gradient (4), write the bf16 weight (2).
OPTIMIZER_BYTES_PER_PARAM = 30
HBM_EFFICIENCY = 0.8  # of the datasheet HBM bandwidth an elementwise update reaches


def _max(a: Any, b: Any) -> Any:
    return (a + b + abs(a - b)) / 2


def _min(a: Any, b: Any) -> Any:
    return (a + b - abs(a - b)) / 2


def bus_links(hardware: Any) -> Links:
    """The bandwidths NCCL's rings reach, per GPU, inside a node and towards other nodes."""
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
    return Links(intra, inter)


def gemm_efficiency(hidden: int, tp: Any, tokens: Any, flops_per_byte: float) -> Any:
    """Fraction of peak reached at a per-GPU GEMM width hidden/tp and `tokens` rows."""
    width = hidden / tp
    scale = flops_per_byte / REFERENCE_FLOPS_PER_BYTE
    return GEMM_PEAK_FRACTION * width / (width + GEMM_HALF_WIDTH * scale) * tokens / (tokens + GEMM_HALF_TOKENS * scale)


@dataclass(frozen=True, kw_only=True)
class StepInputs:
    """Per candidate (scalars or arrays): the layout, and the work and state of its slowest stage."""

    dims: ParallelDims
    tokens_per_micro_batch: Any  # micro_batch_size x seq_length (one DP rank, before cp)
    sequence_parallel: Any
    deepspeed: Any  # 1 for the DeepSpeed backend, 0 for Megatron
    grad_bytes: Any  # per gradient element on the wire (comm.dp_grad_bytes)
    element_bytes: Any  # per weight or activation element under train.precision
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
    x: StepInputs,
    *,
    hidden: int,
    top_k: int,
    peak_flops: float,
    gemm_peak_flops: float,
    hbm_bytes_per_s: float,
    link: Links,
) -> StepTime:
    """Seconds per training step of each candidate, split by term. `peak_flops` is the bf16 peak (core
    attention); `gemm_peak_flops` the GEMMs' (the FP8 peak under train.precision=fp8, else the same)."""
    d = x.dims
    m = d.micro_batches
    tokens_rank = x.tokens_per_micro_batch / d.cp  # rows of every GEMM on one GPU
    kernels = pick(x.deepspeed, UNFUSED_KERNEL_FACTOR, 1.0)
    efficiency = gemm_efficiency(hidden, d.tp, tokens_rank, peak_flops / hbm_bytes_per_s) * kernels
    gemm_eff = gemm_efficiency(hidden, d.tp, tokens_rank, gemm_peak_flops / hbm_bytes_per_s) * kernels
    per_gpu = x.tokens_per_micro_batch / (d.tp * d.cp)
    attention_s = per_gpu * x.attention_flops_per_token / (peak_flops * efficiency)
    gemm_s = per_gpu * (x.stage_flops_per_token - x.attention_flops_per_token) / (gemm_peak_flops * gemm_eff)
    compute_mb = gemm_s + attention_s

    # bytes on the wire per micro-batch: lmspec.compiler.models.comm's volumes, the ones plan.json reports
    tp_split = pick(x.sequence_parallel, d.tp, 1)
    tp_bytes = tp_bytes_per_micro_batch(x.stage_layers, x.full_recompute, d.tp, tokens_rank, hidden, x.element_bytes)
    tp_mb = TP_COMM_EXPOSED_FRACTION * tp_bytes / link.intra_bytes_per_s

    # an all-to-all sends to every peer at once: the peers in the node over NVLink, the rest over the NICs
    ep_bytes = ep_bytes_per_micro_batch(x.stage_moe_layers, d.ep, tokens_rank, tp_split, top_k, hidden, x.element_bytes)
    in_node = _min(d.ep, d.gpus_per_node / d.etp)
    peers = _max(d.ep - 1, 1)
    ep_mb = (
        EP_A2A_EXPOSED_FRACTION
        * ep_bytes
        * _max((in_node - 1) / peers / link.intra_bytes_per_s, (d.ep - in_node) / peers / link.inter_bytes_per_s)
    )
    activation = tokens_rank * hidden * x.element_bytes  # one micro-batch's hidden states on a TP group

    # ring attention: K and V (taken at the hidden width, as MHA; GQA sends less) of every other
    # CP rank pass once forward and twice backward (K/V again, then dK/dV)
    kv = 2 * activation / d.tp
    cp_traffic = x.stage_layers * 3 * (d.cp - 1) * kv / link.ring_bytes_per_s(d, d.cp_span)
    cp_mb = _max(cp_traffic - attention_s, 0.0)

    p2p = (d.pp > 1) * pp_bytes_per_micro_batch(tokens_rank, tp_split, hidden, x.element_bytes)
    pp_mb = p2p / link.ring_bytes_per_s(d, d.pp_span)

    dp_comm = _dp_exposed(x, link, compute_mb)
    sharded = (x.distributed_optimizer != 0) | (x.zero_stage > 0)  # each rank updates its shard only
    local = x.dense_params / pick(sharded, d.dense_dp, 1) + x.expert_params / pick(sharded, d.expert_dp, 1)
    update_bytes = local * OPTIMIZER_BYTES_PER_PARAM
    optimizer = update_bytes / (hbm_bytes_per_s * HBM_EFFICIENCY)
    bubble = (d.pp - 1) * (compute_mb + tp_mb + ep_mb + cp_mb + pp_mb)
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
    per_byte = dp_seconds_per_byte(x.dims, x.dense_params, x.expert_params, link)
    once, every = dp_bytes_per_param(x.zero_stage, x.distributed_optimizer, x.grad_bytes, x.element_bytes)
    hidden_by = DP_OVERLAP_FRACTION * compute_mb
    return _max(once * per_byte - hidden_by, 0.0) + x.dims.micro_batches * _max(every * per_byte - hidden_by, 0.0)


def step_constants(spec: TrainingSpec) -> dict[str, Any]:
    """The step-time model's keyword arguments that depend on the job, not on the layout."""
    hw = spec.hardware
    fp8_tflops = hw.gpu.fp8_tflops if spec.train.precision == "fp8" else None
    return {
        "hidden": spec.model.hidden_size,
        "top_k": spec.model.moe.top_k if spec.model.moe else 0,
        "peak_flops": hw.gpu.bf16_tflops * TFLOPS,
        "gemm_peak_flops": (fp8_tflops or hw.gpu.bf16_tflops) * TFLOPS,
        "hbm_bytes_per_s": hw.gpu.hbm_gb_per_s * GB,
        "link": bus_links(hw),
    }


def estimate_comm_and_step(spec: TrainingSpec, memory: TrainMemory) -> tuple[CommEstimate, StepTime] | None:
    """The step time of the spec's own layout, and its communication with nothing overlapped against that
    step's compute term: one computation behind plan.json, REPORT.md, explain and the communication warning."""
    step = estimate_step_time(spec, memory)
    comm = estimate_comm(spec, memory, float(step.compute)) if step is not None else None
    return (comm, step) if comm is not None and step is not None else None


def estimate_step_time(spec: TrainingSpec, memory: TrainMemory) -> StepTime | None:
    """The step time of the spec's own layout, as `lmspec plan` prices that layout among its candidates;
    the DP traffic and optimizer update are those of the GPU the memory model finds worst (`memory`)."""
    dims = ParallelDims.from_spec(spec)
    if dims is None:
        return None
    m, p, t = spec.model, spec.parallel, spec.train
    work = slowest_stage_work(m, t.seq_length, dims.stage_layers, t.recompute)
    dense, expert = worst_gpu_params(spec, dims, memory)
    inputs = StepInputs(
        dims=dims,
        tokens_per_micro_batch=t.micro_batch_size * t.seq_length,
        sequence_parallel=p.sequence_parallel,
        deepspeed=t.backend == "deepspeed",
        grad_bytes=dp_grad_bytes(t.backend == "deepspeed", t.precision),
        element_bytes=precision_bytes(t.precision),
        zero_stage=p.zero_stage,
        distributed_optimizer=p.distributed_optimizer,
        full_recompute=t.recompute == "full",
        stage_flops_per_token=work.hardware_flops,
        attention_flops_per_token=work.attention_flops,
        stage_layers=work.layers,
        stage_moe_layers=work.moe_layers,
        dense_params=dense,
        expert_params=expert,
    )
    return step_time(inputs, **step_constants(spec))
