"""The low-precision recipes (train.fp8_recipe, train.fp4_recipe) in the memory and step-time models, against
hand arithmetic from the mechanisms compiler/models/recipes.py documents, on `tiny` at seq 1024 (test_fp8.py
derives its parameters, 2,492,672 on one GPU, and its FLOPs).

Per weight TE keeps beside the bf16 weight (2 B): per-tensor recipes 1 B per layout (2 layouts on Hopper's
TN-only FP8 GEMMs, 1 on Blackwell's); blockwise 2 x (1 + 4/16384); mxfp8 2 x (1 + 1/32); nvfp4 2 x (1/2 + 1/16).
A GEMM input TE saves for the weight gradient is kept in one layout with its scales. Per GEMM input element
its quantization moves: the bf16 read (2 B, twice with an amax pass: tensorwise and
nvfp4) plus each layout's elements and scales.
"""

from __future__ import annotations

import pytest
from helpers.specs import spec_of

from lmspec.compiler.inputs import read_inputs
from lmspec.compiler.models.steptime import estimate_step_time
from lmspec.compiler.models.steptime_calibration import CALIBRATION
from lmspec.compiler.models.steptime_inputs import step_constants
from lmspec.compiler.models.train_memory import estimate_train_memory
from lmspec.compiler.models.units import TFLOPS
from lmspec.compiler.rules import rule_problems
from lmspec.compiler.spec.provenance import Origins

TINY_PARAMS = 2_492_672
GEMM_FLOPS, ATTENTION_FLOPS = 14_155_776, 6_291_456  # test_fp8.py's G and A
JOB = ["train.seq_length=1024", "train.global_batch_size=64", "train.recompute=none", "serve.max_model_len=1024"]
FP8 = {r: ["train.precision=fp8", f"train.fp8_recipe={r}"] for r in ("delayed", "tensorwise", "blockwise", "mxfp8")}
NVFP4 = ["train.precision=fp4", "train.fp4_recipe=nvfp4"]


def _spec(hardware: str, *extra: str):
    spec = spec_of(f"hardware={hardware}", *JOB, *extra)
    errors = [p for p in rule_problems(spec, Origins(), read_inputs(spec)) if p.severity == "error"]
    assert errors == [], errors  # lmspec check accepts the job
    return spec


def _memory(hardware: str, *extra: str):
    memory = estimate_train_memory(_spec(hardware, *extra))
    assert memory is not None
    return memory.worst


@pytest.mark.parametrize(
    ("hardware", "recipe", "weights"),
    [
        ("h100_80g", FP8["delayed"], 4 * TINY_PARAMS),  # 2 + 1 + 1 (the transposed copy)
        ("h100_80g", FP8["tensorwise"], 4 * TINY_PARAMS),
        ("b200_180g", FP8["delayed"], 3 * TINY_PARAMS),  # non-TN GEMMs: one FP8 copy serves both
        ("b200_180g", FP8["tensorwise"], 3 * TINY_PARAMS),
        ("mi300x_192g", FP8["delayed"], 4 * TINY_PARAMS),  # priced as Hopper's
        ("h100_80g", FP8["blockwise"], 2 * TINY_PARAMS + 2 * TINY_PARAMS + 2 * 4 * TINY_PARAMS / (128 * 128)),
        ("b200_180g", FP8["blockwise"], 2 * TINY_PARAMS + 2 * TINY_PARAMS + 2 * 4 * TINY_PARAMS / (128 * 128)),
        ("b200_180g", FP8["mxfp8"], 2 * TINY_PARAMS + 2 * TINY_PARAMS + 2 * TINY_PARAMS / 32),
        ("mi355x_288g", FP8["mxfp8"], 2 * TINY_PARAMS + 2 * TINY_PARAMS + 2 * TINY_PARAMS / 32),
        ("b200_180g", NVFP4, 2 * TINY_PARAMS + 2 * TINY_PARAMS / 2 + 2 * TINY_PARAMS / 16),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_weights_hold_the_recipes_copies_and_scales(hardware: str, recipe: list[str], weights: float) -> None:
    bf16, low = _memory(hardware), _memory(hardware, *recipe)
    assert bf16.weights_bytes == 2 * TINY_PARAMS
    assert low.weights_bytes == round(weights)
    # master copies unchanged: fp32 main gradients, fp32 master weights and Adam moments
    assert (low.gradients_bytes, low.optimizer_bytes) == (bf16.gradients_bytes, bf16.optimizer_bytes)


@pytest.mark.parametrize(
    ("recipe", "saved"),
    [
        (FP8["delayed"], 1),  # one FP8 layout, the per-tensor scale not priced
        (FP8["tensorwise"], 1),
        (FP8["blockwise"], 1 + 4 / 128),  # an fp32 scale per 1 x 128 tile
        (FP8["mxfp8"], 1 + 1 / 32),  # an e8m0 scale per 32
        (NVFP4, 0.5 + 1 / 16),  # e2m1 and an e4m3 scale per 16
    ],
)
def test_activations_save_the_gemm_inputs_te_quantizes(recipe: list[str], saved: float) -> None:
    """Per token and layer, the two norms' outputs (QKV and fc1 inputs, 2 x 256) and SwiGLU's output (fc2's
    input, 512) are saved at `saved` bytes instead of 2, and the output projection adds its quantized copy of
    the attention output (256), which attention keeps in bf16: (2 x 256 + 512)(2 - saved) - 256 saved bytes
    less per token, x 1,024 tokens x 4 layers."""
    bf16, low = _memory("b200_180g"), _memory("b200_180g", *recipe)
    less = ((2 * 256 + 512) * (2 - saved) - 256 * saved) * 1024 * 4
    assert bf16.activations_bytes - low.activations_bytes == round(less)


def test_the_exact_figures() -> None:
    """The parametrised expectations above, as plain numbers."""
    assert _memory("b200_180g", *FP8["mxfp8"]).weights_bytes == 10_126_480  # 4.0625 B x 2,492,672
    assert _memory("b200_180g", *NVFP4).weights_bytes == 7_789_600  # 3.125 B
    assert _memory("h100_80g", *FP8["blockwise"]).weights_bytes == 9_971_905  # 4.00048828125 B, rounded


@pytest.mark.parametrize(
    ("hardware", "recipe", "cast", "operand", "peak"),
    [
        ("h100_80g", FP8["delayed"], 2 + 2 * 1, 1, "fp8_tflops"),  # read bf16, write FP8 and its transpose
        ("h100_80g", FP8["tensorwise"], 2 * 2 + 2 * 1, 1, "fp8_tflops"),  # + the amax read
        ("b200_180g", FP8["delayed"], 2 + 1, 1, "fp8_tflops"),
        ("h100_80g", FP8["blockwise"], 2 + 2 * (1 + 4 / 128), 1, "fp8_tflops"),  # fp32 per 1 x 128 tile
        ("b200_180g", FP8["mxfp8"], 2 + 2 * (1 + 1 / 32), 1, "fp8_tflops"),  # e8m0 per 32
        ("b200_180g", NVFP4, 2 * 2 + 2 * (0.5 + 1 / 16), 0.5, "fp4_tflops"),  # amax, e2m1 + e4m3 per 16
        ("b200_180g", [], 0, 2, "bf16_tflops"),
    ],
)
def test_step_constants_price_the_recipes_gemms_and_casts(
    hardware: str, recipe: list[str], cast: float, operand: float, peak: str
) -> None:
    spec = _spec(hardware, *recipe)
    c = step_constants(spec)
    assert (c.quantized, c.cast_bytes, c.operand_bytes) == (bool(recipe), cast, operand)
    assert c.gemm_peak_flops == getattr(spec.hardware.gpu, peak) * TFLOPS


def _compute(hardware: str, *extra: str) -> float:
    spec = _spec(hardware, *extra)
    memory = estimate_train_memory(spec)
    assert memory is not None
    time = estimate_step_time(spec, memory)
    assert time is not None
    return float(time.compute)


def test_on_blackwell_nvfp4_gemms_beat_fp8_which_beat_bf16() -> None:
    """B200's dense peaks are 2,250 (bf16), 4,500 (FP8) and 9,000 (FP4) TFLOP/s; with HBM so fast that every
    GEMM sits on its plateau, compute goes from G / (P x gemm) + A / (P x attention) to G / (4P x fp8_gemm) +
    A / (P x attention) under NVFP4 (attention stays bf16), plus the memory-bound kernels: ~1% of bf16's
    compute on this tiny model, ~2% of NVFP4's shorter one (its casts included), never less."""
    fast = "hardware.gpu.hbm_gb_per_s=1000000"
    bf16, mxfp8, nvfp4 = (_compute("b200_180g", fast, *r) for r in ([], FP8["mxfp8"], NVFP4))
    assert nvfp4 < mxfp8 < bf16
    c = CALIBRATION
    attention = ATTENTION_FLOPS / c.attention("blackwell")
    expected = (GEMM_FLOPS / (4 * c.fp8_gemm) + attention) / (GEMM_FLOPS / c.gemm("blackwell") + attention)
    assert expected < nvfp4 / bf16 < expected * 1.03


def test_at_real_bandwidth_the_quantization_kernels_cost_what_they_move() -> None:
    """H100's 3,350 GB/s: tensorwise moves 2 B more per GEMM input than delayed (its amax read) and blockwise
    1/16 B more (its tile scales); the GEMMs are the same."""
    delayed, tensorwise, blockwise = (_compute("h100_80g", *FP8[r]) for r in ("delayed", "tensorwise", "blockwise"))
    assert delayed < blockwise < tensorwise
