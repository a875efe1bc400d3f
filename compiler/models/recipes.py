"""The low-precision training recipes (train.fp8_recipe, train.fp4_recipe): one row each, as data.

A recipe is how Transformer Engine quantizes a GEMM's inputs: its format, how many elements share a scale
and of what width, whether it reads a tensor once more for its amax, the TE release that first built it
and the generations whose tensor cores run it. The capability rules (compiler/rules/capability.py), the
memory model (train_memory.py), the step-time model (steptime_compute.py) and megatron/config.json
(backends/megatron_config.py) all read these rows; nothing else names a recipe's numbers.

Mechanisms, per recipe (TE 2.x's quantizers, transformer_engine/pytorch/tensor/*):

- delayed: FP8 with one fp32 scale per tensor from the amax history of earlier steps (Float8Tensor).
- tensorwise: FP8 with one fp32 scale per tensor from the tensor's own amax (Float8CurrentScaling): the
  tensor is read once for its amax, then again to cast it.
- blockwise: FP8 with one fp32 scale per 1 x 128 tile of an activation or gradient and per 128 x 128 block
  of a weight (Float8BlockScaling; DeepSeek-V3's recipe, arXiv:2412.19437 section 3.3.2).
- mxfp8: FP8 (e4m3) with one e8m0 (power-of-two, 1-byte) scale per 32 consecutive elements, the OCP
  Microscaling format Blackwell's and CDNA4's tensor cores read (MXFP8BlockScaling).
- nvfp4: FP4 (e2m1, half a byte) with one e4m3 scale per 16 consecutive elements and one fp32 scale per
  tensor (NVFP4BlockScaling, arXiv:2509.25149): the per-tensor scale needs the tensor's amax first. Its 2D
  16 x 16 weight scaling still stores one scale per 16 elements, the layout the GEMM reads.

Layouts: a GEMM reads one operand along rows in the forward and along columns in the backward. Hopper's and
Ada's FP8 GEMMs take only the TN layout, so TE keeps a transposed FP8 copy of each weight and casts each
activation both ways (2 layouts); Blackwell runs non-TN FP8 GEMMs (TE's is_non_tn_fp8_gemm_supported:
compute capability >= 10.0), so a per-tensor scaled tensor serves both directions from one copy. Block-
scaled recipes quantize each direction apart on every generation (the blocks run along the reduction
axis), so they keep 2. AMD's are priced as Hopper's (2 layouts), an upper bound: lmspec has no source for
which layouts hipBLASLt's FP8 GEMMs read on CDNA3 and CDNA4.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args, get_type_hints

from lmspec.compiler.models.units import FP32_BYTES
from lmspec.compiler.spec.sections import GpuSpec, TrainingSpec

RecipeName = Literal["delayed", "tensorwise", "blockwise", "mxfp8", "nvfp4"]

FP8_BYTES = 1.0
FP4_BYTES = 0.5  # e2m1: two elements per byte
E8M0_BYTES = 1.0  # an MX scale: a power of two in one byte
E4M3_BYTES = 1.0  # an NVFP4 block scale
GEMM_INPUT_READ_BYTES = 2  # the bf16 tensor a quantizer reads
PER_TENSOR = 0  # `*_block` of a recipe with one scale per tensor: its few bytes are not priced
# Generations whose FP8 GEMMs take both layouts from one copy (TE's is_non_tn_fp8_gemm_supported).
NON_TN_FP8_GENERATIONS = frozenset({"blackwell"})

_NO_FP8_CORES = "it has no FP8 tensor cores"
_CPU = "the CPU target has no tensor cores and no Transformer Engine"
_AMD_TE = "ROCm's Transformer Engine"


@dataclass(frozen=True, kw_only=True)
class Recipe:
    """One recipe: what it stores and moves per element, and what runs it (`refused`: every generation
    that does not, with why)."""

    name: RecipeName
    summary: str  # what it is, in a few words, for messages
    key: str  # the spec key that names it
    precision: Literal["fp8", "fp4"]  # the train.precision it goes with
    element_bytes: float  # one quantized element
    scale_bytes: float  # one scale
    activation_block: int  # elements of an activation or gradient per scale (PER_TENSOR: one per tensor)
    weight_block: int  # elements of a weight per scale
    amax_pass: bool  # reads the tensor once for its amax before casting it
    per_tensor_layouts: bool  # one copy serves both layouts where the GEMM is non-TN
    te_version: str  # the first Transformer Engine release megatron-core builds it with
    te_source: str  # where that version is checked
    refused: dict[str, str]  # hardware.gpu.generation -> why it does not run there

    def runs_on(self, generation: str) -> bool:
        return generation not in self.refused

    def layouts(self, generation: str) -> int:
        """Quantized copies of one tensor: 1 where a per-tensor scaled copy serves both GEMM layouts."""
        return 1 if self.per_tensor_layouts and generation in NON_TN_FP8_GENERATIONS else 2

    def weight_bytes(self, generation: str) -> float:
        """Bytes per weight TE keeps beside the bf16 weight: each layout's quantized copy and its scales."""
        scales = self.scale_bytes / self.weight_block if self.weight_block else 0.0
        return self.layouts(generation) * (self.element_bytes + scales)

    def saved_input_bytes(self) -> float:
        """Bytes per element of a GEMM input TE saves for the weight gradient: one layout (the columnwise one
        transformer_engine/pytorch/module/linear.py keeps) and its scales."""
        scales = self.scale_bytes / self.activation_block if self.activation_block else 0.0
        return self.element_bytes + scales

    def cast_bytes(self, generation: str) -> float:
        """HBM bytes per GEMM input element its quantization moves: the bf16 read (twice with an amax
        pass), then each layout's quantized elements and scales written."""
        scales = self.scale_bytes / self.activation_block if self.activation_block else 0.0
        reads = GEMM_INPUT_READ_BYTES * (2 if self.amax_pass else 1)
        return reads + self.layouts(generation) * (self.element_bytes + scales)


_PER_TENSOR_FP8 = {
    "ampere": f"Ampere {_NO_FP8_CORES}",
    "cpu": _CPU,
}
_MEGATRON_FP8 = "megatron-core 0.16.1 fp8_utils.get_fp8_recipe"
RECIPES: dict[str, Recipe] = {
    r.name: r
    for r in (
        Recipe(
            name="delayed",
            summary="per-tensor scales from the amax history",
            key="train.fp8_recipe",
            precision="fp8",
            element_bytes=FP8_BYTES,
            scale_bytes=FP32_BYTES,
            activation_block=PER_TENSOR,
            weight_block=PER_TENSOR,
            amax_pass=False,
            per_tensor_layouts=True,
            te_version="1.0",
            te_source="megatron-core 0.16.1 fp8_utils.py: its oldest TE branch (1.0 to 1.14) runs delayed scaling only",
            refused=_PER_TENSOR_FP8,
        ),
        Recipe(
            name="tensorwise",
            summary="per-tensor scales from the current amax",
            key="train.fp8_recipe",
            precision="fp8",
            element_bytes=FP8_BYTES,
            scale_bytes=FP32_BYTES,
            activation_block=PER_TENSOR,
            weight_block=PER_TENSOR,
            amax_pass=True,
            per_tensor_layouts=True,
            te_version="2.2.0.dev0",
            te_source=f"{_MEGATRON_FP8}: Float8CurrentScaling from TE 2.2.0.dev0",
            refused=_PER_TENSOR_FP8,
        ),
        Recipe(
            name="blockwise",
            summary="DeepSeek-V3's 1x128 and 128x128 block scales",
            key="train.fp8_recipe",
            precision="fp8",
            element_bytes=FP8_BYTES,
            scale_bytes=FP32_BYTES,
            activation_block=128,
            weight_block=128 * 128,
            amax_pass=False,
            per_tensor_layouts=False,
            te_version="2.3.0.dev0",
            te_source=f"{_MEGATRON_FP8}: Float8BlockScaling from TE 2.3.0.dev0",
            refused={
                **_PER_TENSOR_FP8,
                "ada": "TE's check_fp8_block_scaling_support needs Hopper or newer (compute capability 9.0)",
                "cdna3": f"{_AMD_TE} has no Float8BlockScaling recipe (delayed and tensorwise scaling only)",
                "cdna4": f"{_AMD_TE} has no Float8BlockScaling recipe (delayed, tensorwise and mxfp8 only)",
            },
        ),
        Recipe(
            name="mxfp8",
            summary="a power-of-two scale per 32 elements; Blackwell, CDNA4",
            key="train.fp8_recipe",
            precision="fp8",
            element_bytes=FP8_BYTES,
            scale_bytes=E8M0_BYTES,
            activation_block=32,
            weight_block=32,
            amax_pass=False,
            per_tensor_layouts=False,
            te_version="2.1.0",
            te_source=f"{_MEGATRON_FP8}: MXFP8BlockScaling from TE 2.1.0",
            refused={
                **_PER_TENSOR_FP8,
                "ada": "MX block-scaled GEMMs are Blackwell tensor-core instructions (TE's check_mxfp8_support: "
                "compute capability 10.0)",
                "hopper": "MX block-scaled GEMMs are Blackwell tensor-core instructions (TE's check_mxfp8_support: "
                "compute capability 10.0)",
                "cdna3": "CDNA3 (MI300X, MI325X) has no MX block-scaled matrix cores; CDNA4 (MI355X) has",
            },
        ),
        Recipe(
            name="nvfp4",
            summary="FP4, an e4m3 scale per 16 elements; Blackwell",
            key="train.fp4_recipe",
            precision="fp4",
            element_bytes=FP4_BYTES,
            scale_bytes=E4M3_BYTES,
            activation_block=16,
            weight_block=16,
            amax_pass=True,
            per_tensor_layouts=False,
            te_version="2.7.0.dev0",
            te_source="megatron-core 0.16.1 fp4_utils.get_fp4_recipe: NVFP4BlockScaling from TE 2.7.0.dev0",
            refused={
                "ampere": "Ampere has no FP4 tensor cores",
                "ada": "NVFP4 GEMMs are Blackwell tensor-core instructions (TE's check_nvfp4_support)",
                "hopper": "NVFP4 GEMMs are Blackwell tensor-core instructions (TE's check_nvfp4_support)",
                "cdna3": "CDNA3 has no FP4 matrix cores",
                "cdna4": f"CDNA4's FP4 is MXFP4 (e8m0 scales per 32), not NVFP4; {_AMD_TE} has no NVFP4 recipe",
                "cpu": _CPU,
            },
        ),
    )
}
_GENERATIONS = set(get_args(get_type_hints(GpuSpec)["generation"]))
assert all(set(r.refused) <= _GENERATIONS for r in RECIPES.values())


def recipe_of(spec: TrainingSpec) -> Recipe | None:
    """The spec's low-precision recipe: train.fp8_recipe under fp8, train.fp4_recipe under fp4; None for a
    16/32-bit job or a recipe left unsaid (rules/capability.py refuses that)."""
    t = spec.train
    name = {"fp8": t.fp8_recipe, "fp4": t.fp4_recipe}.get(t.precision)
    return RECIPES[name] if name is not None else None
