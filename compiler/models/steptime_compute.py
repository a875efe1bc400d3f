"""The compute of one micro-batch on one GPU of the slowest pipeline stage: GEMMs by roofline, core
attention, memory-bound kernels and the host-bound MoE dispatch.

The part of the step-time model (compiler/models/steptime.py) that prices kernels against a GPU's peaks
and HBM bandwidth; communication is steptime_comm.py's. Plain arithmetic on floats and numpy arrays alike.

- GEMMs (projections and MLPs; routed experts at their own shape; the output head) run at the calibrated
  plateau of their GPU generation times a roofline factor of the GEMM's shape: a GEMM of M x N x K moves
  b(MK + KN + MN) bytes for 2MNK FLOPs, and reaches plateau / sqrt(1 + (ridge/AI)^2) of the peak, where AI
  is that FLOP/byte ratio and `ridge` the GPU's (peak over HBM bandwidth). FP8 GEMMs run at the FP8 peak
  with 1-byte operands and their own plateau. `hardware.gpu.sustained_fraction` scales the peaks.
- Core attention: flash attention at the generation's calibrated share of the bf16 peak (TE's fused
  attention computes in bf16 under FP8 too), or without flash attention as two batched GEMMs of depth
  head_dim.
- Memory-bound kernels (norms, residual adds, rotary, attention I/O, the SwiGLU, the MoE permutation, the
  loss, FP8 casts; the materialised scores without flash attention) at a calibrated share of the HBM
  bandwidth: elements per token counted from the layer's widths below, so a narrow model or a high
  FLOP/byte GPU spends a larger share of its step there (what makes small models and H100s run below
  their GEMM plateau).
"""

from __future__ import annotations

from typing import Any

from lmspec.compiler.models import larger, pick
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
PERMUTE_ELEMENTS = 9  # x top_k x hidden: token copies gathered to their experts and scattered back
CROSS_ENTROPY_ELEMENTS = 6  # x vocab, in fp32: the logits cast, softmax and its gradient
RING_STEP_ELEMENTS = 6  # x q width, per ring-attention step after the first: merge the partial output forward,
# accumulate dQ backward
UNFUSED_SCORE_PASSES = 16  # x heads x seq: the materialised scores' writes, softmax, dropout and backward
FP8_CAST_BYTES = 4  # per GEMM input element under FP8: read bf16, write fp8 and its transpose
FP8_OPERAND_BYTES = 1


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


def micro_batch_compute(x: StepInputs, c: StepConstants, cal: Calibration, rows: Any, tp_split: Any) -> tuple[Any, Any]:
    """(seconds of one micro-batch's compute on one GPU of the slowest stage, of which core attention);
    `rows` are the tokens of every GEMM on that GPU, `tp_split` what sequence parallelism divides them by."""
    d = x.dims
    kernels = pick(x.unfused_kernels, UNFUSED_KERNEL_FACTOR, 1.0)
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
