"""The step-time model's fitted constants: their type, and the data file beside this module that holds them.

They are fitted to published training runs by `bench/steptime_published.py --fit`, which writes
steptime_calibration.json; kept apart from the formulas (compiler/models/steptime.py and its parts) so a
refit changes data, never code, and the fit's provenance travels with the numbers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from importlib import resources


@dataclass(frozen=True, kw_only=True)
class Calibration:
    """The constants fitted to published training runs (tests/data/steptime/published_runs.yaml)."""

    ampere_gemm: float  # share of the bf16 peak large GEMMs sustain in training, Ampere
    hopper_gemm: float  # the same, Hopper
    blackwell_gemm: float  # the same, Blackwell (B200, B300, GB200, GB300)
    cdna_gemm: float  # the same, AMD CDNA 3 and 4 (MI300X, MI325X, MI355X): hipBLASLt
    ampere_attention: float  # share of the bf16 peak flash attention (forward + backward) sustains, Ampere
    hopper_attention: float  # the same, Hopper
    blackwell_attention: float  # the same, Blackwell
    cdna_attention: float  # the same, CDNA (Composable Kernel / AITER flash attention)
    fp8_gemm: float  # share of the FP8 peak large FP8 GEMMs sustain (scaling and casts around them aside)
    elementwise: float  # share of the HBM bandwidth the memory-bound kernels sustain
    tp_overlap_exposed: float  # share of TP collectives left exposed by parallel.overlap.tp_comm
    moe_expert_host_s: float  # host seconds launching one local expert's kernels per MoE layer and micro-batch

    @staticmethod
    def names() -> tuple[str, ...]:
        return tuple(f.name for f in fields(Calibration))

    def gemm(self, generation: str) -> float:
        return float(getattr(self, f"{CALIBRATED_GENERATION[generation]}_gemm"))

    def attention(self, generation: str) -> float:
        return float(getattr(self, f"{CALIBRATED_GENERATION[generation]}_attention"))


# hardware.gpu.generation -> the generation whose constants it takes: no published run calibrates Ada or a
# CPU, so they take Ampere's (Ada's SM is Ampere's successor; a CPU job's estimate is only a scale). CDNA 3
# and 4 share constants: the published CDNA runs are few, and both run the same ROCm kernels (hipBLASLt,
# Composable Kernel attention) against their own peaks.
CALIBRATED_GENERATION = {
    "ampere": "ampere",
    "ada": "ampere",
    "hopper": "hopper",
    "blackwell": "blackwell",
    "cdna3": "cdna",
    "cdna4": "cdna",
    "cpu": "ampere",
}

# The fitted constants are data beside this module, written by `bench/steptime_published.py --fit`: the file
# holds the constants and the fit's provenance (command, data file, points, method, which constants the
# points moved, the errors and the leave-one-source-out error) and notes on the constants no point moves.
CALIBRATION_FILE = "steptime_calibration.json"


def load_calibration() -> Calibration:
    """The constants of CALIBRATION_FILE (package data of lmspec.compiler.models)."""
    text = resources.files(__package__).joinpath(CALIBRATION_FILE).read_text(encoding="utf-8")
    return Calibration(**json.loads(text)["constants"])


CALIBRATION = load_calibration()
