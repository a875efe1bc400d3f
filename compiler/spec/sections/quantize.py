"""The `quantize` group: calibrate the converted model with llm-compressor, check what it cost, serve it.

A quantizing build runs `lmspec run BUILD --stage quantize` after `convert`: llm-compressor's `oneshot`
calibrates the converted HuggingFace checkpoint on the training data's own validation split and writes a
compressed-tensors checkpoint that vLLM loads (serve.quantization=compressed-tensors); the stage
measures the perplexity the quantization cost on held-back samples and refuses a checkpoint that lost
more than quantize.max_perplexity_increase.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from lmspec.compiler.spec import kinds
from lmspec.compiler.spec.sections.declare import key

SAMPLES_MAX = 2**20  # calibration or evaluation sequences
PERPLEXITY_INCREASE_MAX = 100.0  # +10,000%: any bound a reviewer means

Scheme = Literal["w4a16", "fp8", "fp8_dynamic", "int8"]
Method = Literal["gptq", "awq", "rtn"]


@dataclass(frozen=True, kw_only=True)
class CalibrationSpec:
    """The sequences calibration runs on: never a download."""

    data: str | None = key(
        "Prefix of a prepared dataset (`lmspec data prepare`'s PREFIX, read whole) to calibrate and evaluate "
        "on; null = the validation split of train.data (train.data.split's second part).",
        example="data/calibration_text_document",
        kind=kinds.PATH,
    )
    samples: int = key(
        "Sequences llm-compressor calibrates on (oneshot's num_calibration_samples).",
        example=512,
        minimum=1,
        maximum=SAMPLES_MAX,
    )
    seq_length: int = key(
        "Tokens per calibration and evaluation sequence (oneshot's max_seq_length).",
        example=2048,
        minimum=2,
        maximum=kinds.TOKENS_MAX,
    )
    eval_samples: int = key(
        "Further sequences, never calibrated on, on which the perplexity of the quantized and the unquantized "
        "model is measured.",
        example=64,
        minimum=1,
        maximum=SAMPLES_MAX,
    )


@dataclass(frozen=True, kw_only=True)
class QuantizeSpec:
    """Post-training quantization of the converted model into a compressed-tensors checkpoint."""

    scheme: Scheme = key(
        "Number format: w4a16 = 4-bit integer weights in groups, 16-bit activations (llm-compressor's "
        "W4A16); fp8 = FP8 weights and FP8 activations, one static scale per tensor each, the activations' "
        "from calibration (FP8); fp8_dynamic = FP8 weights per output channel, activation scales per token at "
        "run time (FP8_DYNAMIC); int8 = INT8 weights per channel and INT8 activations per token (W8A8).",
        example="w4a16",
    )
    method: Method = key(
        "How weights are rounded: gptq = GPTQ's error-compensating rounding from calibration activations; "
        "awq = activation-aware scaling, then rounding (w4a16, asymmetric with zero points); rtn = round to "
        "nearest (llm-compressor's QuantizationModifier).",
        example="gptq",
    )
    group_size: int | None = key(
        "Weights sharing one scale along the input dimension (w4a16); null = one scale per output channel.",
        example=128,
        minimum=1,
        maximum=kinds.WIDTH_MAX,
    )
    smoothquant_strength: float | None = key(
        "SmoothQuant's migration strength, moving activation outliers into the weights before int8 "
        "(SmoothQuantModifier's smoothing_strength); null = no smoothing.",
        example=0.8,
        exclusive_minimum=0,
        maximum=1,
    )
    keep: list[str] | None = key(
        "Modules kept in the model's dtype, as llm-compressor's `ignore` names them: a module name, or "
        "`re:` and a regular expression matched from the start of it; null = the output head and every MoE "
        "router (the model family's names for them). Embeddings and norms are never quantized.",
        example=["lm_head", "re:.*mlp[.]gate$"],
        kind=kinds.MODULE_PATTERN,
        max_items=kinds.SITE_LINES_MAX,
    )
    calibration: CalibrationSpec = key("The calibration and evaluation data.")
    max_perplexity_increase: float = key(
        "Largest accepted rise of perplexity on the held-back samples, as a fraction of the unquantized "
        "model's (0.05 = 5%); beyond it the stage fails and nothing is published for serving.",
        example=0.05,
        minimum=0,
        maximum=PERPLEXITY_INCREASE_MAX,
    )
    output: str = key(
        "Directory the quantized checkpoint is written to; what the serve stage serves.",
        example="runs/llama3_8b/hf-w4a16",
        kind=kinds.PATH,
    )
