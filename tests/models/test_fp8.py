"""FP8 (train.precision=fp8 through Transformer Engine) in the models, against hand-derived numbers
for `tiny` (4 layers, h=256, ffn=512, 8 heads of 32, 2 KV heads, vocab 512, untied) at seq 1024.

Parameters: embedding and head 2 x 512 x 256 = 262,144; per layer Q, O 2 x 256 x 256, K, V
2 x 256 x 64, SwiGLU 3 x 256 x 512, two norms 2 x 256 = 557,568; x 4 = 2,230,272; final norm 256:
2,492,672 on every GPU at tp = pp = 1.
FLOPs per token (6 per multiply-add over forward and backward): SwiGLU 6 x 2 x 256 x 512 x 1.5 x 4 =
9,437,184, projections 6 x 2 x 4 x 256 x 256 x 1.25 = 3,932,160, head 6 x 256 x 512 = 786,432: GEMMs
G = 14,155,776; core attention A = 6 x 2 x 4 x 256 x 1024 / 2 = 6,291,456.
"""

from __future__ import annotations

import pytest
from helpers.specs import spec_of

from lmspec.compiler.inputs import read_inputs
from lmspec.compiler.models.steptime import estimate_step_time
from lmspec.compiler.models.steptime_calibration import CALIBRATION
from lmspec.compiler.models.train_memory import estimate_train_memory
from lmspec.compiler.rules import rule_problems
from lmspec.compiler.spec.provenance import Origins

TINY_PARAMS = 2_492_672
GEMM_FLOPS, ATTENTION_FLOPS = 14_155_776, 6_291_456
# h100 at twice its bf16 peak in FP8, and HBM so fast that GEMM efficiency is its plateau at either peak
BASE = [
    "hardware=h100_80g",
    "hardware.gpu.bf16_tflops=989",
    "hardware.gpu.fp8_tflops=1978",
    "hardware.gpu.hbm_gb_per_s=1000000",
    "train.seq_length=1024",
    "train.global_batch_size=64",
    "train.recompute=none",
    "serve.max_model_len=1024",
]
FP8 = ["train.precision=fp8", "train.fp8_recipe=delayed"]


def _spec(*extra: str):
    spec = spec_of(*BASE, *extra)
    errors = [p for p in rule_problems(spec, Origins(), read_inputs(spec)) if p.severity == "error"]
    assert errors == [], errors  # lmspec check accepts both jobs
    return spec


def test_fp8_keeps_a_two_byte_fp8_weight_copy_per_parameter() -> None:
    """bf16 weight (2 B) + TE's cached FP8 weight and its transpose (1 + 1 B). TE's linear layers save their
    inputs for the weight gradient in FP8 (1 B): per token and layer the two norms' outputs (2 x 256) and
    SwiGLU's output (512) go from 2 B to 1 B, and the output projection adds an FP8 copy of the attention
    output (256 x 1 B) beside attention's bf16 one: 1,024 - 256 = 768 B less, x 1,024 tokens x 4 layers."""
    bf16, fp8 = (estimate_train_memory(_spec(*x)) for x in ([], FP8))
    assert bf16 is not None and fp8 is not None
    assert bf16.worst.weights_bytes == 2 * TINY_PARAMS == 4_985_344
    assert fp8.worst.weights_bytes == 4 * TINY_PARAMS == 9_970_688
    # gradients (fp32 main grads) and optimizer states are those of bf16
    assert (fp8.worst.gradients_bytes, fp8.worst.optimizer_bytes) == (
        bf16.worst.gradients_bytes,
        bf16.worst.optimizer_bytes,
    )
    assert bf16.worst.activations_bytes - fp8.worst.activations_bytes == 768 * 1024 * 4 == 3_145_728


def _times(*jobs: list[str]):
    out = []
    for extra in jobs:
        spec = _spec(*extra)
        memory = estimate_train_memory(spec)
        assert memory is not None
        time = estimate_step_time(spec, memory)
        assert time is not None
        out.append(time)
    return out


def test_fp8_runs_gemms_at_the_fp8_peak_and_attention_at_bf16() -> None:
    """With HBM so fast that every GEMM sits on its plateau (and memory-bound kernels take ~1% of this tiny
    model's compute), compute goes from G / (P x hopper_gemm) + A / (P x attention) to
    G / (2P x fp8_gemm) + A / (P x attention)."""
    bf16, fp8 = _times([], FP8)
    c = CALIBRATION
    attention = ATTENTION_FLOPS / c.hopper_attention
    expected = (GEMM_FLOPS / (2 * c.fp8_gemm) + attention) / (GEMM_FLOPS / c.hopper_gemm + attention)
    assert fp8.compute / bf16.compute == pytest.approx(expected, rel=1e-2)
    assert fp8.compute < bf16.compute
    # the wire bytes stay bf16; less compute hides less of the same DP traffic
    assert fp8.tp_comm == bf16.tp_comm and fp8.dp_comm >= bf16.dp_comm


def test_fp8_at_the_bf16_peak_runs_at_the_fp8_plateau() -> None:
    """An FP8 peak no higher than bf16's buys nothing: the GEMMs run at the (lower) FP8 plateau."""
    bf16, fp8 = _times([], [*FP8, "hardware.gpu.fp8_tflops=989"])
    c = CALIBRATION
    attention = ATTENTION_FLOPS / c.hopper_attention
    expected = (GEMM_FLOPS / c.fp8_gemm + attention) / (GEMM_FLOPS / c.hopper_gemm + attention)
    assert fp8.compute / bf16.compute == pytest.approx(expected, rel=1e-2)
    assert fp8.compute > bf16.compute  # and its FP8 casts cost memory traffic on top
