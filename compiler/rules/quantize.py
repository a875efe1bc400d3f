"""Rules of post-training quantization (the `quantize` group): a converted model to calibrate, a scheme and
method llm-compressor and vLLM both run, kept layers vLLM can load, and a serving engine that serves the
checkpoint the quantize stage writes on hardware that has the kernels.

What the quantized model is (its linear layers by the family's names, what quantize.keep keeps) is
compiler/quantize_modules.py's; the kernel facts below are vLLM 0.32's, read from
vllm/model_executor/layers/quantization/compressed_tensors/ and the kernels it picks.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

from lmspec.compiler.conversion.kinds import SplitKind
from lmspec.compiler.errors import Problem, error, warning
from lmspec.compiler.models.dims import device_kind
from lmspec.compiler.models.serve_memory import served_dtype
from lmspec.compiler.quantize_modules import (
    COMPRESSED_TENSORS,
    EXPERT_SHOWN,
    HEAD,
    Linear,
    expert_patterns,
    is_kept,
    kept_modules,
    kept_shards,
    linear_modules,
    matches,
    router_patterns,
)
from lmspec.compiler.rules.budget import computable
from lmspec.compiler.rules.context import RuleContext, S, ServingContext, SpecContext
from lmspec.compiler.spec.sections import ModelSpec, Spec

# vLLM's W4A16 kernels (Marlin, Machete: MARLIN_SUPPORTED_GROUP_SIZES in quantization/utils/marlin_utils.py)
# take these group sizes, or one scale per output channel (group_size null).
VLLM_GROUP_SIZES = (32, 64, 128)
FP8_SCHEMES = ("fp8", "fp8_dynamic")
# CompressedTensorsW8A8Fp8.get_min_capability: 89 (Ada); below it vLLM serves FP8 weights-only (W8A16, Marlin).
FP8_COMPUTE_GENERATIONS = ("ada", "hopper", "blackwell", "cdna3", "cdna4")
PRESETS = "quantize=w4a16_gptq (or another preset of specs/quantize/)"


def _show_quantize(ctx: SpecContext[S]) -> str:
    """`quantize (w4a16 by gptq, from command-line override)`: the section, shorter than its whole value."""
    q = ctx.spec.quantize
    what = f"{q.scheme} by {q.method}" if q is not None else "null"
    return f"quantize ({what}, from {ctx.origins.of('quantize')})"


def quantize_has_a_converted_checkpoint(ctx: RuleContext) -> Iterator[Problem]:
    s = ctx.spec
    if s.quantize is None or (s.train is not None and s.convert is not None):
        return
    missing = ctx.show("train") if s.train is None else ctx.show("convert")
    yield error(
        "quantize",
        f"{_show_quantize(ctx)} calibrates the converted model, but {missing}: quantize needs a converted "
        "checkpoint (a job that trains and converts); set quantize=null, or train=default and convert=default "
        "(to serve a released checkpoint already quantized, set serve.model_path=DIR)",
    )


def scheme_takes_method(ctx: RuleContext) -> Iterator[Problem]:
    q = ctx.spec.quantize
    if q is None:
        return
    if q.method == "awq" and q.scheme != "w4a16":
        yield error(
            "quantize.method",
            f"{ctx.show('quantize.method')} with {ctx.show('quantize.scheme')}: AWQ scales 4-bit weights in "
            "groups (llm-compressor's AWQModifier, W4A16 with zero points); use quantize.method=gptq or "
            "quantize.method=rtn, or quantize.scheme=w4a16",
        )
    if q.smoothquant_strength is not None and q.scheme != "int8":
        yield error(
            "quantize.smoothquant_strength",
            f"{ctx.show('quantize.smoothquant_strength')} with {ctx.show('quantize.scheme')}: SmoothQuant moves "
            "activation outliers into the weights so that INT8 activations hold them, and only int8 "
            "quantizes activations to integers; set quantize.smoothquant_strength=null, or quantize.scheme=int8",
        )
    if q.group_size is not None and q.scheme != "w4a16":
        yield error(
            "quantize.group_size",
            f"{ctx.show('quantize.group_size')} with {ctx.show('quantize.scheme')}: the 8-bit schemes keep one "
            "scale per output channel (llm-compressor's FP8, FP8_DYNAMIC and W8A8); set quantize.group_size=null",
        )
    elif q.group_size is not None and q.group_size not in VLLM_GROUP_SIZES:
        yield error(
            "quantize.group_size",
            f"{ctx.show('quantize.group_size')}: vLLM's W4A16 kernels (Marlin, Machete) take groups of "
            f"{', '.join(map(str, VLLM_GROUP_SIZES))} weights or one scale per output channel; use "
            f"quantize.group_size={' or '.join(map(str, VLLM_GROUP_SIZES))}, or null",
        )


def input_dimension(m: ModelSpec, shape: str) -> str:
    """The model keys a linear layer's input size is, as messages name them (shape: its key in
    lmspec.compiler.conversion.mapping.shape_table)."""
    if shape == "o_proj":
        return f"model.num_attention_heads x model.{'mla.v_head_dim' if m.attention == 'mla' else 'head_dim'}"
    if shape == "fc2":
        return "model.ffn_hidden_size"
    if shape == "expert_fc2":
        return "model.moe.ffn_hidden_size"
    if shape == "shared_fc2":
        return "model.moe.num_shared_experts x model.moe.ffn_hidden_size"
    if shape == "q_up":
        return "model.mla.q_lora_rank"
    if shape == "kv_up":
        return "model.mla.kv_lora_rank"
    return "model.hidden_size"


def _quantized(spec: Spec) -> list[Linear]:
    kept = kept_modules(spec)
    return [linear for linear in linear_modules(spec.model) if not is_kept(linear, kept)]


def _group_fix(sizes: set[int], divided: str) -> str:
    fits = [g for g in VLLM_GROUP_SIZES if all(size % g == 0 for size in sizes)]
    fit = "quantize.group_size=" + " or ".join(map(str, fits))
    return (f"use {fit}, or " if fits else "use ") + f"quantize.group_size=null (one scale per {divided})"


def group_size_divides_inputs(ctx: RuleContext) -> Iterator[Problem]:
    """Each group of w4a16 scales a run of group_size inputs: every quantized layer's input must split evenly."""
    q, m = ctx.spec.quantize, ctx.spec.model
    if q is None or q.scheme != "w4a16" or q.group_size not in VLLM_GROUP_SIZES or not computable(ctx.spec):
        return  # another group size is refused by scheme_takes_method, with the sizes vLLM takes
    quantized = _quantized(ctx.spec)
    sizes = {linear.in_features for linear in quantized}
    reported: set[str] = set()
    for linear in quantized:
        dimension = input_dimension(m, linear.shape)
        if linear.in_features % q.group_size == 0 or dimension in reported:
            continue
        reported.add(dimension)
        yield error(
            "quantize.group_size",
            f"{ctx.show('quantize.group_size')} does not divide {dimension} = {linear.in_features}, the input of "
            f"{linear.names[0]} (and its like in every layer); {_group_fix(sizes, 'output channel')}, "
            "or keep those layers in quantize.keep",
        )


def group_size_divides_tp_shards(ctx: ServingContext) -> Iterator[Problem]:
    """vLLM splits a row-parallel layer's inputs over serve.tp ranks; each rank's share must hold whole groups."""
    q, v, m = ctx.spec.quantize, ctx.spec.serve, ctx.spec.model
    if q is None or q.scheme != "w4a16" or q.group_size not in VLLM_GROUP_SIZES or v.tp == 1:
        return
    if not computable(ctx.spec):
        return
    row_parallel = [
        linear
        for linear in _quantized(ctx.spec)
        if linear.split is SplitKind.ROW and not (linear.part == "experts" and v.expert_parallel)
    ]
    sizes = {linear.in_features // v.tp for linear in row_parallel if linear.in_features % v.tp == 0}
    for linear in row_parallel:
        share = linear.in_features // v.tp
        if linear.in_features % v.tp or share % q.group_size == 0:  # an uneven split is the layout rules'
            continue
        yield error(
            "quantize.group_size",
            f"{ctx.show('quantize.group_size')} does not divide the {share} inputs of {linear.names[0]} each of "
            f"{ctx.show('serve.tp')} ranks holds ({input_dimension(m, linear.shape)} = {linear.in_features} / "
            f"{v.tp}): vLLM's kernels need whole groups on every rank; {_group_fix(sizes, 'output channel')}, "
            "or a smaller serve.tp",
        )
        return


def _shown_list(patterns: tuple[str, ...]) -> str:
    return json.dumps(list(patterns), separators=(",", ":"))


def keep_holds_head_and_routers(ctx: RuleContext) -> Iterator[Problem]:
    """The output head and every router stay in the model's dtype. vLLM's compressed-tensors loader quantizes a
    layer whose class name holds a target ("Linear"); its output head is a ParallelLMHead, so a quantized
    lm_head would not load. vLLM builds Mixtral's and DeepSeek's routers (GateLinear) without a quantization
    config, and a rounded router sends tokens to other experts: llm-compressor's own MoE examples keep them."""
    q, m = ctx.spec.quantize, ctx.spec.model
    if q is None or q.keep is None or not computable(ctx.spec):
        return
    kept = tuple(q.keep)
    needed: list[str] = []
    why: list[str] = []
    if not any(matches(p, HEAD) for p in kept):
        needed.append(HEAD)
        why.append("the output head (vLLM loads lm_head unquantized: its ParallelLMHead is no Linear)")
    if any(not is_kept(linear, kept) for linear in linear_modules(m) if linear.part == "router"):
        needed += router_patterns(m)
        why.append(
            "a MoE router (vLLM builds Mixtral's and DeepSeek's unquantized, and a rounded router sends tokens "
            "to other experts)"
        )
    if needed:
        yield error(
            "quantize.keep",
            f"{ctx.show('quantize.keep')} leaves {' and '.join(why)} to quantization; add "
            f"{' and '.join(repr(n) for n in needed)}: "
            f"quantize.keep='{_shown_list((*kept, *needed))}'",
        )


def keep_takes_fused_layers_whole(ctx: RuleContext) -> Iterator[Problem]:
    """vLLM fuses q/k/v and gate/up into one layer and refuses shards of different schemes (should_ignore_layer)."""
    q = ctx.spec.quantize
    if q is None or q.keep is None or not computable(ctx.spec):
        return
    kept = tuple(q.keep)
    for linear in linear_modules(ctx.spec.model):
        shards = kept_shards(linear, kept)
        if shards and len(shards) < len(linear.names):
            others = [name for name in linear.names if name not in shards]
            yield error(
                "quantize.keep",
                f"{ctx.show('quantize.keep')} keeps {', '.join(shards)} but not {', '.join(others)}: vLLM fuses "
                "them into one layer and refuses shards of different schemes; keep all of them or none",
            )
            return


def _every_name(m: ModelSpec) -> Iterator[str]:
    """Every linear layer's module name, each routed expert's own."""
    experts = m.moe.num_experts if m.moe else 1
    marker = f".experts.{EXPERT_SHOWN}."
    for linear in linear_modules(m):
        for name in linear.names:
            if linear.part == "experts" and marker in name:
                yield from (name.replace(marker, f".experts.{e}.") for e in range(experts))
            else:
                yield name


def keep_patterns_match(ctx: RuleContext) -> Iterator[Problem]:
    q, m = ctx.spec.quantize, ctx.spec.model
    if q is None or q.keep is None or not computable(ctx.spec):
        return
    unmatched = list(q.keep)
    for name in _every_name(m):
        unmatched = [p for p in unmatched if not matches(p, name)]
        if not unmatched:
            return
    example = next((linear.names[0] for linear in linear_modules(m) if linear.part != "head"), HEAD)
    yield warning(
        "quantize.keep",
        f"{ctx.show('quantize.keep')}: {', '.join(map(repr, unmatched))} "
        f"{'matches' if len(unmatched) == 1 else 'match'} no linear layer of "
        f"{ctx.show('model.family')} (names like {example!r}; `re:` patterns are matched from the start of "
        "the name); fix the name, or drop it",
    )


def calibration_within_positions(ctx: RuleContext) -> Iterator[Problem]:
    s = ctx.spec
    if s.quantize is None:
        return
    length, positions = s.quantize.calibration.seq_length, s.model.max_position_embeddings
    if length > positions:
        fit = min(positions, s.train.seq_length) if s.train is not None else positions
        yield error(
            "quantize.calibration.seq_length",
            f"{ctx.show('quantize.calibration.seq_length')} exceeds {ctx.show('model.max_position_embeddings')}: "
            f"the model has no positions past it; use quantize.calibration.seq_length={fit}",
        )
    elif s.train is not None and length > s.train.seq_length:
        yield warning(
            "quantize.calibration.seq_length",
            f"{ctx.show('quantize.calibration.seq_length')} is longer than {ctx.show('train.seq_length')}: the "
            "model never trained on the positions past it, so calibration and the perplexity bound would judge "
            f"its extrapolation, not the quantization; use quantize.calibration.seq_length={s.train.seq_length}",
        )


def serve_loads_the_quantized_checkpoint(ctx: ServingContext) -> Iterator[Problem]:
    v = ctx.spec.serve
    if ctx.spec.quantize is None:
        if v.quantization == COMPRESSED_TENSORS and v.model_path is None:
            yield error(
                "serve.quantization",
                f"{ctx.show('serve.quantization')} but {ctx.show('quantize')} and {ctx.show('serve.model_path')}: "
                f"the model served is the conversion output, unquantized, and nothing calibrated it; set {PRESETS}, "
                "or serve.model_path to a compressed-tensors checkpoint, or serve.quantization=null",
            )
        return
    if v.model_path is not None:
        yield error(
            "serve.model_path",
            f"{ctx.show('serve.model_path')} with {_show_quantize(ctx)}: the serve stage serves the quantized "
            f"checkpoint ({ctx.show('quantize.output')}); set serve.model_path=null, or quantize=null to serve "
            f"{v.model_path}",
        )
    if v.quantization != COMPRESSED_TENSORS:
        yield error(
            "serve.quantization",
            f"{ctx.show('serve.quantization')} with {_show_quantize(ctx)}: vLLM loads llm-compressor's checkpoint "
            f"by its compressed-tensors config; set serve.quantization={COMPRESSED_TENSORS}",
        )


def serving_hardware_runs_the_scheme(ctx: ServingContext) -> Iterator[Problem]:
    s = ctx.spec
    q = s.quantize
    if q is None or s.serve.model_path is not None or not computable(s):
        return
    gpu = s.hardware.gpu
    if device_kind(s) == "cpu":
        if q.scheme == "fp8":
            yield error(
                "quantize.scheme",
                f"{ctx.show('quantize.scheme')} served on {ctx.show('hardware.name')}: vLLM's CPU engine has no "
                "kernel for FP8 activations with static scales (_C::static_scaled_fp8_quant); use "
                "quantize.scheme=fp8_dynamic (quantize=fp8_dynamic) or quantize.scheme=int8",
            )
        if q.scheme == "w4a16" and served_dtype(s) == "float32":
            yield error(
                "serve.dtype",
                f"{ctx.show('serve.dtype')} with {ctx.show('quantize.scheme')} on {ctx.show('hardware.name')}: "
                "vLLM's CPU kernel for 4-bit weights (cpu_gemm_wna16) multiplies bfloat16 or float16 activations "
                "only, and fails on the first request in float32; set serve.dtype=bfloat16",
            )
        if s.model.moe is not None and any(linear.part == "experts" for linear in _quantized(s)):
            keep = (*kept_modules(s), *expert_patterns(s.model))
            yield warning(
                "quantize.keep",
                f"{ctx.show('quantize.keep')} quantizes the routed experts, served on {ctx.show('hardware.name')}: "
                "vLLM's CPU engine runs quantized experts only where the CPU has AMX tiles (Sapphire Rapids on; "
                "CPUExpertsInt4/Int8), and the serve stage refuses a machine without; to serve anywhere keep "
                f"them: quantize.keep='{_shown_list(keep)}'",
            )
    elif q.scheme in FP8_SCHEMES and gpu.generation not in FP8_COMPUTE_GENERATIONS:
        yield warning(
            "quantize.scheme",
            f"{ctx.show('quantize.scheme')} served on {ctx.show('hardware.gpu.generation')}: vLLM runs FP8 "
            "activations on FP8 tensor cores only (compute capability 8.9: Ada, Hopper); here it serves the "
            "weights as weight-only FP8 (Marlin) and multiplies in bf16, so the memory saving stays and the "
            "FLOP/s gain is lost; quantize.scheme=int8 runs on INT8 tensor cores, w4a16 reads a quarter of the bytes",
        )


RULES = (
    quantize_has_a_converted_checkpoint,
    scheme_takes_method,
    group_size_divides_inputs,
    keep_holds_head_and_routers,
    keep_takes_fused_layers_whole,
    keep_patterns_match,
    calibration_within_positions,
)
SERVING_RULES = (serve_loads_the_quantized_checkpoint, group_size_divides_tp_shards, serving_hardware_runs_the_scheme)
