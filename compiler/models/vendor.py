"""Who makes the accelerator, read from hardware.gpu.generation: the one reader.

NVIDIA's generations run CUDA, NCCL and NVIDIA's Transformer Engine; AMD Instinct's (CDNA) run ROCm, RCCL
(NCCL's API and most of its NCCL_* settings, plus its own) and ROCm's build of Transformer Engine. The
communication env file, the doctor's signatures and the capability table's precision rows follow it.
"""

from __future__ import annotations

from typing import Literal, get_args, get_type_hints

from lmspec.compiler.spec.sections import GpuSpec, HardwareSpec

Vendor = Literal["nvidia", "amd", "cpu"]

VENDOR_OF_GENERATION: dict[str, Vendor] = {
    "ampere": "nvidia",
    "ada": "nvidia",
    "hopper": "nvidia",
    "blackwell": "nvidia",
    "cdna3": "amd",
    "cdna4": "amd",
    "cpu": "cpu",
}
assert set(VENDOR_OF_GENERATION) == set(get_args(get_type_hints(GpuSpec)["generation"]))


def vendor_of(hardware: HardwareSpec) -> Vendor:
    return VENDOR_OF_GENERATION[hardware.gpu.generation]
