"""REPORT.md's quantization section: the scheme and method, what stays in the model's dtype, what the linear
weights then weigh (compiler/quantize_modules.py), the calibration and evaluation sequences, the perplexity
bound the quantize stage holds the checkpoint to, and where it is written."""

from __future__ import annotations

from lmspec.compiler.emit.report_format import percent, storage
from lmspec.compiler.models.units import DTYPE_BYTES
from lmspec.compiler.plan import Plan, kept_dtype
from lmspec.compiler.quantize_modules import QUANTIZED_PARTS, Part, checkpoint_scheme, kept_modules, quantized_model

SCHEMES = {
    "w4a16": "W4A16: 4-bit integer weights, 16-bit activations",
    "fp8": "FP8 (W8A8): FP8 weights and activations, static per-tensor scales from calibration",
    "fp8_dynamic": "FP8 dynamic (W8A8): FP8 weights per output channel, activation scales per token at run time",
    "int8": "INT8 (W8A8): INT8 weights per output channel, INT8 activations per token",
}
METHODS = {
    "gptq": "GPTQ (error-compensating rounding from the calibration activations)",
    "awq": "AWQ (activation-aware scales, then rounding, with zero points)",
    "rtn": "round to nearest (llm-compressor's QuantizationModifier)",
}
PART_NAMES: dict[Part, str] = {
    "attention": "attention",
    "mla_down": "MLA down-projections",
    "dense_mlp": "dense MLP and shared experts",
    "experts": "routed experts",
}


def _scales(plan: Plan) -> str:
    q = plan.spec.quantize
    assert q is not None
    weights = checkpoint_scheme(q)["weights"]
    assert weights is not None
    if weights["strategy"] == "group":
        return f"one per {q.group_size} inputs (quantize.group_size)"
    return f"one per {'weight matrix' if weights['strategy'] == 'tensor' else 'output channel'}"


def quantize_rows(plan: Plan) -> list[tuple[str, str]]:
    """The quantization section of a job that quantizes (quantize set); empty otherwise."""
    q = plan.spec.quantize
    if q is None or plan.train is None:
        return []
    c, smoothing = q.calibration, q.smoothquant_strength
    dtype = kept_dtype(plan.spec)
    dtype_bytes = DTYPE_BYTES[dtype]
    model = quantized_model(plan.spec, dtype_bytes)
    parts = [model.part(p) for p in QUANTIZED_PARTS if model.part(p).params]
    before = sum(p.params for p in parts) * dtype_bytes
    after = sum(p.bytes for p in parts)
    shares = ", ".join(
        f"{PART_NAMES[p]} {percent(model.part(p).quantized_share)}" for p in QUANTIZED_PARTS if model.part(p).params
    )
    kept = ", ".join(f"`{pattern}`" for pattern in kept_modules(plan.spec))
    whose = "quantize.keep" if q.keep is not None else "quantize.keep=null: the output head and the family's routers"
    source = (
        f"the validation split of train.data (train.data.split={plan.trained().spec.train.data.split})"
        if c.data is None
        else f"`{c.data}` (quantize.calibration.data)"
    )
    served = (
        "the serve stage serves it (serve.quantization=compressed-tensors)"
        if plan.serve is not None
        else "not served (serve: null)"
    )
    return [
        ("scheme", f"{SCHEMES[q.scheme]}; scales {_scales(plan)}"),
        ("method", METHODS[q.method] + (f"; SmoothQuant {smoothing:g} first" if smoothing else "")),
        ("kept in " + dtype, f"{kept} ({whose})"),
        ("quantized share of the weights", shares),
        (
            "linear weights",
            f"{storage(before)} in {dtype} -> {storage(after)} with their scales ({percent(after / before)})"
            if before
            else "none",
        ),
        ("calibration", f"{c.samples:,} sequences of {c.seq_length:,} tokens from {source}"),
        ("evaluation", f"{c.eval_samples:,} further sequences, never calibrated on: the perplexity of both models"),
        (
            "accepted when",
            f"the perplexity rises by at most {percent(q.max_perplexity_increase)} "
            "(quantize.max_perplexity_increase); else the stage fails and publishes nothing",
        ),
        ("output", f"`{q.output}`, by `lmspec run BUILD --stage quantize` after convert; {served}"),
    ]
