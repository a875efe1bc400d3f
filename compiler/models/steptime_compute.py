"""The compute of one micro-batch on one GPU of the slowest pipeline stage: GEMMs by roofline, core
attention, memory-bound kernels and the host-bound MoE layers.

The part of the step-time model (compiler/models/steptime.py) that prices kernels against a GPU's peaks
and HBM bandwidth; communication is steptime_comm.py's. Plain arithmetic on floats and numpy arrays alike.

- GEMMs (projections and MLPs; routed experts at their own shape; the output head) run at the calibrated
  plateau of their GPU generation times a roofline factor of the GEMM's shape: a GEMM of M x N x K moves
  b(MK + KN + MN) bytes for 2MNK FLOPs, and reaches plateau / sqrt(1 + (ridge/AI)^2) of the peak, where AI
  is that FLOP/byte ratio and `ridge` the GPU's (peak over HBM bandwidth). FP8 and FP4 GEMMs run at the
  FP8 or FP4 peak with the recipe's operand bytes (1, or 0.5 for NVFP4) and the calibrated FP8 plateau, the
  one share fitted for low-precision GEMMs. `hardware.gpu.sustained_fraction` scales the peaks.
- Routed experts: each local expert's GEMMs at M = the copies the busiest EP rank receives over its local
  experts (tokens x top_k x ep / experts x the imbalance of compiler/models/moe_load.py), so small experts
  at low EP run as the small, memory-bound GEMMs they are; shared experts at their own width.
- Core attention: flash attention at the generation's calibrated share of the bf16 peak (TE's fused
  attention computes in bf16 under FP8 too), or without flash attention as two batched GEMMs of depth
  head_dim.
- Memory-bound kernels (norms, residual adds, rotary, attention I/O, the SwiGLU, the MoE router and token
  permutation, the loss, the recipe's quantization of every GEMM input (compiler/models/recipes.py
  `cast_bytes`: the bf16 read, twice where the recipe takes the tensor's amax first, and each layout's
  quantized elements and scales written); the materialised scores without flash attention) at a calibrated share
  of the HBM bandwidth: elements per token counted from the layer's widths below, so a narrow model or a
  high FLOP/byte GPU spends a larger share of its step there (what makes small models and H100s run below
  their GEMM plateau).
- MoE layers are launched by the host op by op, every local expert adding its own; dropless dispatch syncs
  the host with the GPU once per layer, so a MoE layer takes the longer of its GPU time and its launch time
  (the calibrated `moe_expert_host_s` per local expert): fine-grained experts at low EP wait on the host.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lmspec.compiler.models import larger, pick
from lmspec.compiler.models.moe_load import rank_imbalance
from lmspec.compiler.models.steptime_calibration import Calibration
from lmspec.compiler.models.steptime_inputs import StepConstants, StepInputs
from lmspec.compiler.models.units import FP32_BYTES

ROOFLINE_SHARPNESS = 2  # p in plateau / (1 + (ridge/AI)^p)^(1/p): how sharply a GEMM turns compute-bound
# HuggingFace modeling code under DeepSpeed runs unfused norms, rotary and SwiGLU kernels.
UNFUSED_KERNEL_FACTOR = 0.85
# Elements read or written per token by the memory-bound kernels of one layer, forward and backward (the
# backward moves about twice the forward's), per unit of the width they act on:
NORM_RESIDUAL_ELEMENTS = 30  # x hidden: two RMSNorms (read h, write h) and two residual adds (2 in, 1 out)
ATTENTION_IO_ELEMENTS = 12  # x (q width + k/v width): rotary on q and k, flash attention's reads and writes
ACTIVATION_ELEMENTS = 9  # x MLP width: SwiGLU reads the gate and up halves, writes their product
# x top_k x hidden, per routed copy: each permutation pass reads and writes every copy (2), forward and
# backward (x 2). megatron-core's unfused path runs four passes: permute to experts, sort the received chunks
# by local expert (alltoall with several local experts), unsort, unpermute (with the routing weights); TE's
# fused kernels (train.moe.permute_fusion) fold the sorts into the permutations: two passes.
PERMUTE_ELEMENTS = 16
FUSED_PERMUTE_ELEMENTS = 8
ROUTER_ELEMENTS = 8  # x experts, in fp32: logits, score function, top-k and its backward, the aux-loss terms
CROSS_ENTROPY_ELEMENTS = 6  # x vocab, in fp32: the logits cast, softmax and its gradient
RING_STEP_ELEMENTS = 6  # x q width, per ring-attention step after the first: merge the partial output forward,
# accumulate dQ backward
UNFUSED_SCORE_PASSES = 16  # x heads x seq: the materialised scores' writes, softmax, dropout and backward


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


@dataclass(frozen=True)
class MicroBatchCompute:
    """Seconds of one micro-batch's compute on one GPU of the slowest stage, and the parts communication
    can hide behind; `imbalance` is the EP rank load factor the routed work was priced at."""

    total: Any
    attention: Any  # core attention (ring attention hides behind it)
    shared_experts: Any  # the shared experts' GEMMs (train.moe.shared_expert_overlap hides behind them)
    imbalance: Any


def micro_batch_compute(
    x: StepInputs, c: StepConstants, cal: Calibration, rows: Any, tp_split: Any
) -> MicroBatchCompute:
    """One micro-batch's compute on one GPU of the slowest stage; `rows` are the tokens of every GEMM on
    that GPU, `tp_split` what sequence parallelism divides them by."""
    d = x.dims
    imbalance = rank_imbalance(d.ep, rows, c.top_k, c.routing) if c.top_k else 1.0
    kernels = pick(x.unfused_kernels, UNFUSED_KERNEL_FACTOR, 1.0)
    redo = 1 + x.full_recompute / 3  # full recompute repeats every layer's forward
    attention = x.attention_flops_per_token * (1 + x.recompute_attention / 3)
    expert = x.stage_moe_layers * c.routed_expert_flops * redo
    shared_flops = x.stage_moe_layers * c.shared_expert_flops * redo
    dense = larger(x.stage_flops_per_token - attention - expert - shared_flops, 0.0)
    per_gpu = x.tokens_per_micro_batch / (d.tp * d.cp)  # tokens whose FLOPs one GPU runs (TP splits each)

    operand = c.operand_bytes
    ridge = c.gemm_peak_flops / c.hbm_bytes_per_s
    plateau = (cal.fp8_gemm if c.quantized else cal.gemm(c.generation)) * kernels
    dense_eff = gemm_efficiency(rows, c.hidden / d.tp, c.hidden, operand, ridge, plateau)
    gemm_s = per_gpu * dense / dense_eff / c.gemm_peak_flops
    shared_s = 0.0
    if c.top_k:
        # each local expert's GEMMs at their own shape: the copies the busiest EP rank receives, shared out
        expert_rows = larger(rows * c.top_k * d.ep / c.num_experts * imbalance, 1)  # capacity: ceil, >= 1
        expert_eff = gemm_efficiency(expert_rows, c.expert_ffn / d.etp, c.hidden, operand, ridge, plateau)
        gemm_s = gemm_s + per_gpu * expert * imbalance / expert_eff / c.gemm_peak_flops
        if c.shared_experts:
            width = c.shared_experts * c.expert_ffn / d.tp
            shared_s = (
                per_gpu
                * shared_flops
                / gemm_efficiency(rows, width, c.hidden, operand, ridge, plateau)
                / c.gemm_peak_flops
            )
        gemm_s = gemm_s + shared_s

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
    moe_width = (c.top_k * c.expert_ffn / d.etp * imbalance + c.shared_experts * c.expert_ffn / d.tp) / tp_split
    dense_layer = shared + ACTIVATION_ELEMENTS * c.ffn / d.tp
    # the permutation gathers the routed copies (all-gather dispatch: masks every gathered token of the EP
    # group) and scatters them back; the router reads and writes its scores over every expert in fp32
    gathered = d.ep if c.dispatcher == "allgather" else c.top_k * imbalance
    permute = FUSED_PERMUTE_ELEMENTS if c.permute_fusion else PERMUTE_ELEMENTS
    moe_layer = shared + ACTIVATION_ELEMENTS * moe_width + permute * gathered * c.hidden / tp_split
    moe_layer += ROUTER_ELEMENTS * c.num_experts * FP32_BYTES / x.element_bytes
    elements = ((x.stage_layers - x.stage_moe_layers) * dense_layer + x.stage_moe_layers * moe_layer) * redo
    loss_bytes = CROSS_ENTROPY_ELEMENTS * c.vocab / d.tp * FP32_BYTES
    moved = rows * (elements * x.element_bytes + loss_bytes)
    if c.quantized:  # every GEMM input quantized: the layer's inputs forward, its output gradients backward
        attention_inputs = (c.hidden + c.q_width) / d.tp  # QKV and output projections
        dense_inputs = attention_inputs + (c.hidden + c.ffn) / d.tp  # fc1 and fc2
        # a MoE layer casts every routed copy into fc1 and fc2, and the shared experts' inputs
        routed = c.top_k * imbalance * (c.hidden + c.expert_ffn / d.etp)
        moe_inputs = attention_inputs + (routed + c.shared_experts * (c.hidden + c.expert_ffn / d.tp)) / tp_split
        layers = (x.stage_layers - x.stage_moe_layers) * dense_inputs + x.stage_moe_layers * moe_inputs
        moved += rows * 2 * layers * c.cast_bytes * redo
    elementwise_s = moved / (c.hbm_bytes_per_s * cal.elementwise) / kernels
    # the host launches a MoE layer's kernels one Python op at a time, and every local expert adds its own
    # (TE's grouped linear splits, quantizes and multiplies expert by expert); dropless dispatch copies the
    # token counts per expert to the host once per layer (the all-to-all splits and the GEMMs' m_splits are
    # host lists), so the host cannot run ahead across layers: a MoE layer takes the longer of its GPU time
    # and its launch time
    gpu_s = gemm_s + attention_s + elementwise_s
    local_experts = c.num_experts / (d.ep * d.etp) if c.top_k else 0
    launch_s = local_experts * cal.moe_expert_host_s * redo
    layer_s = gpu_s / larger(x.stage_layers, 1)
    host_s = x.stage_moe_layers * larger(launch_s - layer_s, 0.0)
    return MicroBatchCompute(gpu_s + host_s, attention_s, shared_s, imbalance)
