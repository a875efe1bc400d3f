"""Estimated time of one training step: compute by roofline, plus the communication compute does not hide.

Plain arithmetic (no numpy import) that works on floats and numpy arrays alike, so one formula prices one
layout or a million. Per micro-batch, one GPU of the slowest pipeline stage runs:

- its GEMMs (projections and MLPs; routed experts at their own shape; the output head) at the
  calibrated plateau of its GPU generation times a roofline factor of the GEMM's shape: a GEMM of
  M x N x K moves b(MK + KN + MN) bytes for 2MNK FLOPs, and reaches plateau / sqrt(1 + (ridge/AI)^2) of the
  peak, where AI is that FLOP/byte ratio and `ridge` the GPU's (peak over HBM bandwidth). FP8 GEMMs run at the
  FP8 peak with 1-byte operands and their own plateau. `hardware.gpu.sustained_fraction` scales the peaks.
- its core attention: flash attention at the generation's calibrated share of the bf16 peak (TE's fused
  attention computes in bf16 under FP8 too), or without flash attention as two batched GEMMs of depth head_dim;
- its memory-bound kernels (norms, residual adds, rotary, attention I/O, the SwiGLU, the MoE permutation, the
  loss, FP8 casts; the materialised scores without flash attention) at a calibrated share of the HBM bandwidth:
  elements per token counted from the layer's widths below, so a narrow model or a high FLOP/byte GPU spends a
  larger share of its step there (what makes small models and H100s run below their GEMM plateau).

Communication, by dimension (volumes: `lmspec.compiler.models.comm`, at NCCL bus bandwidth):
- TP collectives are on the critical path, unless `parallel.overlap.tp_comm` pipelines them with the GEMMs
  (Transformer Engine's userbuffers, with sequence parallelism): then the calibrated share stays exposed.
- Expert all-to-alls are on the critical path, unless `parallel.overlap.moe_a2a`: then one micro-batch's
  all-to-alls hide behind another's compute (megatron-core's combined 1F1B, DeepSeek-V3's DualPipe).
- Ring attention (CP) passes the K and V heads (the KV width, not the hidden: GQA sends kv_heads/heads of it)
  of every other CP rank once forward and twice backward, hidden behind the core attention of the same layer.
- Pipeline send/recv is exposed once per micro-batch (interleaved chunks' extra sends overlap: Megatron's
  overlap_p2p_comm); 1F1B idles (pp - 1) micro-batch slots per step, interleaving v chunks (pp - 1) / v.
- DP: the gradient reduce after the last micro-batch's backward hides behind that backward with
  `parallel.overlap.grad_reduce`, the sharded weights' all-gather behind the next first forward with
  `parallel.overlap.param_gather` (Megatron's distributed optimizer; DeepSpeed ZeRO-1/2 gather after the step
  and ZeRO-0 reduces after the backward, unhidden); ZeRO-2/3 traffic of every micro-batch hides behind each
  micro-batch's compute. A bucketed reduce hides behind DP_OVERLAP_FRACTION of its window (the last bucket
  waits for the last gradients).
Then the optimizer update, memory-bound on the GPU's shard of the parameters.

The constants fitted to published runs are `CALIBRATION`, loaded once from steptime_calibration.json beside
this module (bench/steptime_published.py fits and scores them, leaving each source out in turn, and `--fit`
writes that file); every other constant below is a count or a datasheet-derived ratio.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from importlib import resources
from typing import Any

from lmspec.compiler.backends import backend_of
from lmspec.compiler.models import larger, pick, smaller
from lmspec.compiler.models.comm import (
    CommEstimate,
    Links,
    dp_grad_bytes,
    dp_seconds_per_byte,
    dp_traffic,
    ep_bytes_per_micro_batch,
    pp_bytes_per_micro_batch,
    tp_bytes_per_micro_batch,
    worst_gpu_params,
)
from lmspec.compiler.models.dims import ParallelDims
from lmspec.compiler.models.flops import routed_expert_flops_per_token
from lmspec.compiler.models.stages import slowest_stage_work
from lmspec.compiler.models.train_memory import TrainMemory
from lmspec.compiler.models.units import FP32_BYTES, GB, GBIT, TFLOPS, precision_bytes
from lmspec.compiler.spec.sections import TrainingSpec


@dataclass(frozen=True, kw_only=True)
class Calibration:
    """The constants fitted to published training runs (tests/data/steptime/published_runs.yaml)."""

    ampere_gemm: float  # share of the bf16 peak large GEMMs sustain in training, Ampere
    hopper_gemm: float  # the same, Hopper
    ampere_attention: float  # share of the bf16 peak flash attention (forward + backward) sustains, Ampere
    hopper_attention: float  # the same, Hopper
    fp8_gemm: float  # share of the FP8 peak large FP8 GEMMs sustain (scaling and casts around them aside)
    elementwise: float  # share of the HBM bandwidth the memory-bound kernels sustain
    tp_overlap_exposed: float  # share of TP collectives left exposed by parallel.overlap.tp_comm
    moe_expert_host_s: float  # host-bound seconds per local expert, MoE layer and micro-batch (dropless)

    @staticmethod
    def names() -> tuple[str, ...]:
        return tuple(f.name for f in fields(Calibration))

    def gemm(self, generation: str) -> float:
        return float(getattr(self, f"{CALIBRATED_GENERATION[generation]}_gemm"))

    def attention(self, generation: str) -> float:
        return float(getattr(self, f"{CALIBRATED_GENERATION[generation]}_attention"))


# hardware.gpu.generation -> the generation whose constants it takes: no published run calibrates Ada or a
# CPU, so they take Ampere's (Ada's SM is Ampere's successor; a CPU job's estimate is only a scale).
CALIBRATED_GENERATION = {"ampere": "ampere", "ada": "ampere", "hopper": "hopper", "cpu": "ampere"}

# The fitted constants are data beside this module, written by `bench/steptime_published.py --fit`: the file
# holds the constants and the fit's provenance (command, data file, points, method, which constants the
# points moved, the errors and the leave-one-source-out error) and notes on the constants no point moves.
CALIBRATION_FILE = "steptime_calibration.json"


def load_calibration() -> Calibration:
    """The constants of CALIBRATION_FILE (package data of lmspec.compiler.models)."""
    text = resources.files(__package__).joinpath(CALIBRATION_FILE).read_text(encoding="utf-8")
    return Calibration(**json.loads(text)["constants"])


CALIBRATION = load_calibration()

# --- kernels ---
ROOFLINE_SHARPNESS = 2  # p in plateau / (1 + (ridge/AI)^p)^(1/p): how sharply a GEMM turns compute-bound
# HuggingFace modeling code under DeepSpeed runs unfused norms, rotary and SwiGLU kernels.
UNFUSED_KERNEL_FACTOR = 0.85
# Elements read or written per token by the memory-bound kernels of one layer, forward and backward (the
# backward moves about twice the forward's), per unit of the width they act on:
NORM_RESIDUAL_ELEMENTS = 30  # x hidden: two RMSNorms (read h, write h) and two residual adds (2 in, 1 out)
ATTENTION_IO_ELEMENTS = 12  # x (q width + k/v width): rotary on q and k, flash attention's reads and writes
ACTIVATION_ELEMENTS = 9  # x MLP width: SwiGLU reads the gate and up halves, writes their product
PERMUTE_ELEMENTS = 9  # x top_k x hidden: token copies gathered to their experts and scattered back
CROSS_ENTROPY_ELEMENTS = 6  # x vocab, in fp32: the logits cast, softmax and its gradient
RING_STEP_ELEMENTS = 6  # x q width, per ring-attention step after the first: merge the partial output forward,
# accumulate dQ backward
UNFUSED_SCORE_PASSES = 16  # x heads x seq: the materialised scores' writes, softmax, dropout and backward
FP8_CAST_BYTES = 4  # per GEMM input element under FP8: read bf16, write fp8 and its transpose
FP8_OPERAND_BYTES = 1

# --- links ---
# Datasheet NVLink figures add both directions; a ring sends one way at a time on each link.
LINK_DIRECTION_FRACTION = {"nvlink": 0.5, "pcie": 1.0, "shm": 1.0}
# NCCL bus bandwidth over link bandwidth (nccl-tests: ~230 of 300 GB/s per direction on A100
# NVLink, ~40 of 50 GB/s per 400G NIC).
INTRA_NODE_BUS_EFFICIENCY = 0.8
INTER_NODE_BUS_EFFICIENCY = 0.8

# --- overlap and the optimizer ---
DP_OVERLAP_FRACTION = 0.8  # of its window a bucketed DP collective hides behind
# Optimizer update, bytes touched per parameter in the GPU's shard: read+write fp32 master,
# Adam m and v (24), read the fp32 gradient (4), write the bf16 weight (2).
OPTIMIZER_BYTES_PER_PARAM = 30
HBM_EFFICIENCY = 0.8  # of the datasheet HBM bandwidth an elementwise update reaches


def bus_links(hardware: Any) -> Links:
    """The bandwidths NCCL's rings reach, per GPU, inside a node and over its share of the node's NICs."""
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


def roofline(intensity: Any, ridge: float, plateau: float) -> Any:
    """Share of the peak a kernel of `intensity` FLOP/byte reaches: its plateau, scaled down near the ridge."""
    return plateau / (1 + (ridge / intensity) ** ROOFLINE_SHARPNESS) ** (1 / ROOFLINE_SHARPNESS)


def gemm_efficiency(m: Any, n: Any, k: Any, operand_bytes: Any, ridge: float, plateau: float) -> Any:
    """Share of the peak an M x N x K GEMM reaches: 2MNK FLOPs over b(MK + KN + MN) bytes."""
    return roofline(2 * m * n * k / (operand_bytes * (m * k + k * n + m * n)), ridge, plateau)


def flash_attention_efficiency(seq_length: int, cp: Any, element_bytes: Any, ridge: float, plateau: float) -> Any:
    """Share of the bf16 peak flash attention reaches on the blocks it is given: ring attention (cp > 1) splits
    each sequence into 2 x cp load-balanced chunks and runs one kernel per pair of n-token chunks, 4 n^2 d FLOPs
    over Q, K, V and O's 4 n d elements: n / (2 x element bytes) FLOP/byte whatever the head dim, so short
    chunks leave tensor cores waiting on memory."""
    chunk = seq_length / (2 * cp)
    return roofline(chunk / element_bytes, ridge, plateau)


@dataclass(frozen=True, kw_only=True)
class StepConstants:
    """What the step-time model takes from the job rather than the layout (`step_constants`)."""

    hidden: int
    q_width: int  # query (and attention output) width of a layer: heads x head dim
    kv_width: int  # keys plus values per token of a layer as attention reads them (ring attention sends these)
    head_dim: int
    heads: int
    seq_length: int
    ffn: int  # dense MLP width
    expert_ffn: int
    top_k: int
    shared_experts: int
    num_experts: int
    vocab: int
    routed_expert_flops: float  # model FLOPs per token of one MoE layer's routed experts
    fp8: bool
    flash_attention: bool
    overlap_grad_reduce: bool
    overlap_param_gather: bool
    overlap_tp_comm: bool
    peak_flops: float  # sustained bf16 peak (core attention, the bf16 GEMMs)
    gemm_peak_flops: float  # sustained peak of the GEMMs: FP8's under train.precision=fp8
    hbm_bytes_per_s: float
    link: Links
    generation: str


@dataclass(frozen=True, kw_only=True)
class StepInputs:
    """Per candidate (scalars or arrays): the layout, and the work and state of its slowest stage."""

    dims: ParallelDims
    virtual_stages: Any  # model chunks per pipeline rank (1: plain 1F1B)
    tokens_per_micro_batch: Any  # micro_batch_size x seq_length (one DP rank, before cp)
    sequence_parallel: Any
    unfused_kernels: Any  # the backend runs transformers' modeling code (TrainingBackend.hf_model_code)
    zero_sharding: Any  # the backend shards with ZeRO stages (TrainingBackend.zero_sharding)
    grad_bytes: Any  # per gradient element on the wire (comm.dp_grad_bytes)
    element_bytes: Any  # per weight or activation element under train.precision
    zero_stage: Any
    distributed_optimizer: Any
    full_recompute: Any
    recompute_attention: Any  # 1 where selective or full recompute repeats the core attention
    moe_a2a: Any  # 1 where parallel.overlap.moe_a2a hides this layout's all-to-alls (`moe_a2a_overlaps`)
    stage_flops_per_token: Any  # hardware FLOPs of the slowest stage's layers (+ head), per token
    attention_flops_per_token: Any  # core attention (model FLOPs) of the most loaded stage
    stage_layers: Any  # layers on the slowest stage
    stage_moe_layers: Any  # of which MoE
    dense_params: Any  # non-expert parameters on one GPU of the largest stage
    expert_params: Any  # routed-expert parameters on that GPU


@dataclass(frozen=True, kw_only=True)
class StepTime:
    """Seconds per step, by term (arrays when the inputs are): the exposed terms sum to the step time; the
    `*_raw` ones are each dimension's communication with nothing overlapped (plan.json's `comm`)."""

    compute: Any
    tp_comm: Any
    ep_comm: Any
    cp_comm: Any
    pp_comm: Any
    bubble: Any
    dp_comm: Any
    optimizer: Any
    tp_raw: Any
    ep_raw: Any
    cp_raw: Any
    pp_raw: Any
    dp_raw: Any

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
        """Communication left exposed after overlap."""
        return self.tp_comm + self.ep_comm + self.cp_comm + self.pp_comm + self.dp_comm

    def unoverlapped(self) -> CommEstimate:
        """This step's communication with nothing overlapped, beside its compute (one layout's floats)."""
        return CommEstimate(
            tp_s=float(self.tp_raw),
            dp_s=float(self.dp_raw),
            ep_s=float(self.ep_raw),
            pp_s=float(self.pp_raw),
            cp_s=float(self.cp_raw),
            compute_s=float(self.compute),
        )


def step_time(x: StepInputs, c: StepConstants, cal: Calibration = CALIBRATION) -> StepTime:
    """Seconds per training step of each candidate, split by term."""
    d = x.dims
    m, v = d.micro_batches, x.virtual_stages
    rows = x.tokens_per_micro_batch / d.cp  # tokens of every GEMM on one GPU
    tp_split = pick(x.sequence_parallel, d.tp, 1)
    kernels = pick(x.unfused_kernels, UNFUSED_KERNEL_FACTOR, 1.0)
    compute_mb, attention_s = _compute(x, c, cal, rows, tp_split, kernels)

    tp_bytes = tp_bytes_per_micro_batch(x.stage_layers, x.full_recompute, d.tp, rows, c.hidden, x.element_bytes)
    tp_mb = tp_bytes / c.link.intra_bytes_per_s
    tp_overlapped = c.overlap_tp_comm * x.sequence_parallel * (d.tp > 1)
    tp_exposed = tp_mb * pick(tp_overlapped, cal.tp_overlap_exposed, 1.0)

    # an all-to-all sends to every peer at once: the peers in the node over NVLink, the rest over the NICs
    ep_bytes = ep_bytes_per_micro_batch(x.stage_moe_layers, d.ep, rows, tp_split, c.top_k, c.hidden, x.element_bytes)
    in_node = smaller(d.ep, d.gpus_per_node / d.etp)
    peers = larger(d.ep - 1, 1)
    link = c.link
    ep_mb = ep_bytes * larger(
        (in_node - 1) / peers / link.intra_bytes_per_s, (d.ep - in_node) / peers / link.inter_bytes_per_s
    )
    ep_exposed = pick(x.moe_a2a, larger(ep_mb - compute_mb, 0.0), ep_mb)

    # ring attention: the K and V of every other CP rank pass once forward and twice backward (K/V, then dK/dV)
    kv = rows * c.kv_width / d.tp * x.element_bytes
    cp_mb = x.stage_layers * 3 * (d.cp - 1) * kv / link.ring_bytes_per_s(d, d.cp_span, d.tp)
    cp_exposed = larger(cp_mb - attention_s, 0.0)

    p2p = (d.pp > 1) * pp_bytes_per_micro_batch(rows, tp_split, c.hidden, x.element_bytes)
    pp_mb = p2p / link.ring_bytes_per_s(d, d.pp_span, d.world // d.pp)

    per_micro_batch = compute_mb + tp_exposed + ep_exposed + cp_exposed + pp_mb
    dp_exposed, dp_raw = _dp(x, c, compute_mb)
    sharded = (x.distributed_optimizer != 0) | (x.zero_stage > 0)  # each rank updates its shard only
    local = x.dense_params / pick(sharded, d.dense_dp, 1) + x.expert_params / pick(sharded, d.expert_dp, 1)
    optimizer = local * OPTIMIZER_BYTES_PER_PARAM / (c.hbm_bytes_per_s * HBM_EFFICIENCY)
    return StepTime(
        compute=m * compute_mb,
        tp_comm=m * tp_exposed,
        ep_comm=m * ep_exposed,
        cp_comm=m * cp_exposed,
        pp_comm=m * pp_mb,
        bubble=(d.pp - 1) / v * per_micro_batch,
        dp_comm=dp_exposed,
        optimizer=optimizer,
        tp_raw=m * tp_mb,
        ep_raw=m * ep_mb,
        cp_raw=m * cp_mb,
        pp_raw=m * v * pp_mb,
        dp_raw=dp_raw,
    )


def moe_a2a_overlaps(asked: Any, ep: Any, full_recompute: Any, pp: Any, virtual_stages: Any) -> Any:
    """Where parallel.overlap.moe_a2a hides a layout's all-to-alls: megatron-core's combined 1F1B needs expert
    parallelism, no full recompute and, on a pipeline, virtual stages (rules/overlap.py refuses the rest).
    Plain arithmetic: `lmspec plan` prices each candidate's all-to-alls hidden only where this holds."""
    return (asked != 0) & (ep > 1) & (full_recompute == 0) & ((pp == 1) | (virtual_stages > 1))


def _compute(
    x: StepInputs, c: StepConstants, cal: Calibration, rows: Any, tp_split: Any, kernels: Any
) -> tuple[Any, Any]:
    """(seconds of one micro-batch's compute on one GPU of the slowest stage, of which core attention)."""
    d = x.dims
    redo = 1 + x.full_recompute / 3  # full recompute repeats every layer's forward
    attention = x.attention_flops_per_token * (1 + x.recompute_attention / 3)
    expert = x.stage_moe_layers * c.routed_expert_flops * redo
    dense = larger(x.stage_flops_per_token - attention - expert, 0.0)
    per_gpu = x.tokens_per_micro_batch / (d.tp * d.cp)  # tokens whose FLOPs one GPU runs (TP splits each)

    operand = FP8_OPERAND_BYTES if c.fp8 else x.element_bytes
    ridge = c.gemm_peak_flops / c.hbm_bytes_per_s
    plateau = (cal.fp8_gemm if c.fp8 else cal.gemm(c.generation)) * kernels
    dense_eff = gemm_efficiency(rows, c.hidden / d.tp, c.hidden, operand, ridge, plateau)
    gemm_s = per_gpu * dense / dense_eff / c.gemm_peak_flops
    if c.top_k:
        expert_rows = rows * c.top_k * d.ep / c.num_experts  # per local expert, routing balanced
        expert_eff = gemm_efficiency(expert_rows, c.expert_ffn / d.etp, c.hidden, operand, ridge, plateau)
        gemm_s = gemm_s + per_gpu * expert / expert_eff / c.gemm_peak_flops

    if c.flash_attention:
        attention_eff = flash_attention_efficiency(
            c.seq_length, d.cp, x.element_bytes, c.peak_flops / c.hbm_bytes_per_s, cal.attention(c.generation) * kernels
        )
    else:  # QK^T and scores x V: batched GEMMs of depth head_dim over the sequence
        seq = c.seq_length / d.cp
        attention_eff = gemm_efficiency(
            seq, seq, c.head_dim, x.element_bytes, c.peak_flops / c.hbm_bytes_per_s, cal.gemm(c.generation) * kernels
        )
    attention_s = per_gpu * attention / (c.peak_flops * attention_eff)

    # memory-bound kernels: elements per token of one dense and one MoE layer on this GPU
    shared = ATTENTION_IO_ELEMENTS * (c.q_width + c.kv_width) / d.tp + NORM_RESIDUAL_ELEMENTS * c.hidden / tp_split
    shared += RING_STEP_ELEMENTS * (d.cp - 1) * c.q_width / d.tp
    if not c.flash_attention:
        shared += UNFUSED_SCORE_PASSES * c.heads / d.tp * c.seq_length / d.cp
    moe_width = (c.top_k * c.expert_ffn / d.etp + c.shared_experts * c.expert_ffn / d.tp) / tp_split
    dense_layer = shared + ACTIVATION_ELEMENTS * c.ffn / d.tp
    moe_layer = shared + ACTIVATION_ELEMENTS * moe_width + PERMUTE_ELEMENTS * c.top_k * c.hidden / tp_split
    elements = ((x.stage_layers - x.stage_moe_layers) * dense_layer + x.stage_moe_layers * moe_layer) * redo
    loss_bytes = CROSS_ENTROPY_ELEMENTS * c.vocab / d.tp * FP32_BYTES
    moved = rows * (elements * x.element_bytes + loss_bytes)
    if c.fp8:  # every GEMM input cast to FP8: the layer's inputs forward, its output gradients backward
        inputs = (2 * c.hidden + c.q_width) / d.tp + (c.ffn if c.top_k == 0 else c.top_k * c.expert_ffn) / d.tp
        moved += rows * x.stage_layers * 2 * inputs * FP8_CAST_BYTES * redo
    elementwise_s = moved / (c.hbm_bytes_per_s * cal.elementwise) / kernels
    # dropless dispatch sizes each expert's buffers from token counts copied to the host: the GPU waits on the
    # launches of every local expert's kernels (quantize, GEMMs, activation; forward and backward) per MoE layer
    local_experts = c.num_experts / (d.ep * d.etp) if c.top_k else 0
    host_s = x.stage_moe_layers * local_experts * cal.moe_expert_host_s * redo
    return gemm_s + attention_s + elementwise_s + host_s, attention_s


def _dp(x: StepInputs, c: StepConstants, compute_mb: Any) -> tuple[Any, Any]:
    """(DP gradient/parameter traffic per step left exposed after overlap, and all of it)."""
    per_byte = dp_seconds_per_byte(x.dims, x.dense_params, x.expert_params, c.link)
    t = dp_traffic(x.zero_stage, x.distributed_optimizer, x.grad_bytes, x.element_bytes)
    forward = compute_mb / (3 + x.full_recompute)  # a backward is twice its forward (+ the recomputed forward)
    backward = compute_mb - forward
    unoverlapped_reduce = x.zero_sharding * (x.zero_stage == 0)  # DeepSpeed all-reduces after the backward
    reduce_window = c.overlap_grad_reduce * (1 - unoverlapped_reduce) * backward
    gather_window = c.overlap_param_gather * (1 - x.zero_sharding) * forward  # DeepSpeed gathers after the step
    every_window = compute_mb * pick(x.zero_stage == 3, c.overlap_param_gather, c.overlap_grad_reduce)
    exposed = (
        larger(t.reduce * per_byte - DP_OVERLAP_FRACTION * reduce_window, 0.0)
        + larger(t.gather * per_byte - DP_OVERLAP_FRACTION * gather_window, 0.0)
        + x.dims.micro_batches * larger(t.every * per_byte - DP_OVERLAP_FRACTION * every_window, 0.0)
    )
    return exposed, (t.reduce + t.gather + x.dims.micro_batches * t.every) * per_byte


def step_constants(spec: TrainingSpec) -> StepConstants:
    """The step-time model's inputs that depend on the job, not on the layout."""
    hw, m, t, p = spec.hardware, spec.model, spec.train, spec.parallel
    fp8 = t.precision == "fp8" and hw.gpu.fp8_tflops is not None
    sustained = hw.gpu.sustained_fraction
    if m.attention == "mla":
        assert m.mla is not None
        head_dim = m.mla.qk_nope_head_dim + m.mla.qk_rope_head_dim
        kv_width = m.num_attention_heads * (head_dim + m.mla.v_head_dim)  # per head after the up-projection
    else:
        head_dim = m.head_dim
        kv_width = 2 * m.num_kv_heads * m.head_dim
    moe = m.moe
    return StepConstants(
        hidden=m.hidden_size,
        q_width=m.num_attention_heads * head_dim,
        kv_width=kv_width,
        head_dim=head_dim,
        heads=m.num_attention_heads,
        seq_length=t.seq_length,
        ffn=m.ffn_hidden_size,
        expert_ffn=moe.ffn_hidden_size if moe else 0,
        top_k=moe.top_k if moe else 0,
        shared_experts=moe.num_shared_experts if moe else 0,
        num_experts=moe.num_experts if moe else 0,
        vocab=m.vocab_size,
        routed_expert_flops=routed_expert_flops_per_token(m),
        fp8=fp8,
        flash_attention=t.flash_attention,
        overlap_grad_reduce=p.overlap.grad_reduce,
        overlap_param_gather=p.overlap.param_gather,
        overlap_tp_comm=p.overlap.tp_comm,
        peak_flops=hw.gpu.bf16_tflops * sustained * TFLOPS,
        gemm_peak_flops=(hw.gpu.fp8_tflops if fp8 and hw.gpu.fp8_tflops else hw.gpu.bf16_tflops) * sustained * TFLOPS,
        hbm_bytes_per_s=hw.gpu.hbm_gb_per_s * GB,
        link=bus_links(hw),
        generation=hw.gpu.generation,
    )


def step_inputs(spec: TrainingSpec, memory: TrainMemory) -> StepInputs | None:
    """The spec's own layout as the step-time model's inputs; the DP traffic and optimizer update are those
    of the GPU the memory model finds worst (`memory`). None when the layout does not divide."""
    dims = ParallelDims.from_spec(spec)
    if dims is None:
        return None
    m, p, t = spec.model, spec.parallel, spec.train
    backend = backend_of(spec)
    work = slowest_stage_work(m, t.seq_length, dims.stage_layers, t.recompute)
    dense, expert = worst_gpu_params(spec, dims, memory)
    return StepInputs(
        dims=dims,
        virtual_stages=p.virtual_stages or 1,
        tokens_per_micro_batch=t.micro_batch_size * t.seq_length,
        sequence_parallel=p.sequence_parallel,
        unfused_kernels=backend.hf_model_code,
        zero_sharding=backend.zero_sharding,
        grad_bytes=dp_grad_bytes(backend.grad_reduce_in_fp32(t.precision), t.precision),
        element_bytes=precision_bytes(t.precision),
        zero_stage=p.zero_stage,
        distributed_optimizer=p.distributed_optimizer,
        full_recompute=t.recompute == "full",
        recompute_attention=t.recompute != "none",
        moe_a2a=moe_a2a_overlaps(p.overlap.moe_a2a, p.ep, t.recompute == "full", p.pp, p.virtual_stages or 1),
        stage_flops_per_token=work.hardware_flops,
        attention_flops_per_token=work.attention_flops,
        stage_layers=work.layers,
        stage_moe_layers=work.moe_layers,
        dense_params=dense,
        expert_params=expert,
    )


def estimate_step_time(spec: TrainingSpec, memory: TrainMemory) -> StepTime | None:
    """The step time of the spec's own layout, as `lmspec plan` prices that layout among its candidates."""
    inputs = step_inputs(spec, memory)
    return step_time(inputs, step_constants(spec)) if inputs is not None else None


def estimate_comm_and_step(spec: TrainingSpec, memory: TrainMemory) -> tuple[CommEstimate, StepTime] | None:
    """The step time of the spec's own layout, and its communication with nothing overlapped beside that
    step's compute: one computation behind plan.json, REPORT.md, explain and the communication warning."""
    step = estimate_step_time(spec, memory)
    return (step.unoverlapped(), step) if step is not None else None
