"""Units and element sizes: the one place each is written, so every estimate divides by the same number.

Sources mix binary and decimal units (PyTorch reports GiB, vendors label GB and Gbit/s),
so both are named, never written inline.
"""

from __future__ import annotations

GIB = 2**30
MIB = 2**20
GB = 10**9
TB = 10**12
GBIT = GB / 8  # bytes per second of one Gbit/s
BITS_PER_BYTE = 8
TFLOPS = 1e12
SECONDS_PER_DAY = 86400
SECONDS_PER_MINUTE = 60

# Bytes of one element, by the dtype names mapping.json, checkpoints and vLLM use.
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
# train.precision -> the dtype its weights, activations and 16-bit gradients are held in (fp8 and fp4 run
# their GEMMs in FP8 or FP4 but hold weights, gradients and the activations between GEMMs in bf16, as TE
# does; what TE keeps quantized beside them is priced by compiler/models/recipes.py).
PRECISION_DTYPE = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "fp8": "bfloat16", "fp4": "bfloat16"}
FP32_BYTES = DTYPE_BYTES["float32"]
SHORT_DTYPE = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


def gib(n_bytes: float, decimals: int = 1) -> str:
    """`52.1 GiB`: a memory size in text, with thousands separators; one decimal in messages (rules,
    doctor), two in REPORT.md (compiler/emit/report_format.py)."""
    return f"{n_bytes / GIB:,.{decimals}f} GiB"


def precision_bytes(precision: str) -> int:
    """Bytes of one weight or activation element under train.precision."""
    return DTYPE_BYTES[PRECISION_DTYPE[precision]]


def held_precision(precision: str) -> str:
    """`bf16`: the precision train.precision holds weights in (bf16 under fp8 and fp4), as a report names it."""
    return SHORT_DTYPE[PRECISION_DTYPE[precision]]
