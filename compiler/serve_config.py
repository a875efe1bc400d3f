"""Is the served model the spec's? The served directory's config.json against the spec, before vLLM starts.

The spec prices and lays out the model it names (spec.model); vLLM serves whatever config.json says. When
they differ the memory budget, the tensor-parallel split and the context length were checked for another
model, and vLLM fails minutes later (or, worse, serves with a budget that does not hold). The config is
read by the family importer (`lmspec import-model`'s, so "the same model" means what an import means),
and each mismatch is named with both values and the fix. Pure: no torch, no vLLM.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Iterator, Mapping
from typing import Any

from lmspec.compiler.errors import UsageError
from lmspec.compiler.families.hf_model import model_group
from lmspec.compiler.models.serve_length import vllm_max_model_len
from lmspec.compiler.plan import served_model_dir
from lmspec.compiler.quantize_modules import (
    COMPRESSED_TENSORS,
    checkpoint_scheme,
    is_kept,
    kept_modules,
    linear_modules,
)
from lmspec.compiler.spec.sections import ModelSpec, ServeSpec, ServingSpec
from lmspec.compiler.spec.typed import from_dict

QUANTIZATION_CONFIG = "quantization_config"  # HF's record of how released weights are quantized
CALIBRATED = ("awq", "gptq")  # methods whose scales come from calibration: only a checkpoint that has them
REQUANTIZE = (
    "run `lmspec run BUILD --stage quantize` to write the spec's, or compile with the checkpoint's quantize keys"
)
# The QuantizationArgs fields that decide what vLLM runs and what the weights weigh (compiler/quantize_modules.py).
COMPARED_ARGS = ("num_bits", "type", "strategy", "group_size", "symmetric", "dynamic")
QUANTIZATION_METHODS: tuple[str, ...] = tuple(  # serve.quantization's values, from its Literal | None
    m for arg in typing.get_args(typing.get_type_hints(ServeSpec)["quantization"]) for m in typing.get_args(arg)
)


def served_config_problems(spec: ServingSpec, config: Mapping[str, Any]) -> list[str]:
    """Every way `config` (serve.model_path's config.json) contradicts `spec`; empty when it is the spec's model."""
    source = f"{served_model_dir(spec)}/config.json"
    problems = _quantization_problems(spec, config.get(QUANTIZATION_CONFIG), source)
    architecture = {k: v for k, v in config.items() if k != QUANTIZATION_CONFIG}  # compared above, not a model key
    try:
        served = model_group(architecture, spec.model.name)
    except UsageError as exc:
        return [f"{source}: {exc}", *problems]
    fix = f"lmspec import-model {spec.serve.model_path or 'DIR'} -o specs/model/NAME.yaml and compile with model=NAME"
    differing = [
        f"model.{key} is {ours!r} in the spec but {theirs!r} in {source}"
        for key, ours, theirs in _differences(dataclasses.asdict(spec.model), served)
    ]
    if differing:
        problems.insert(0, f"{source} is not the spec's model: {'; '.join(differing)}; fix: {fix}")
    v, heads = spec.serve, served["num_attention_heads"]
    if heads % v.tp:
        problems.append(
            f"serve.tp={v.tp} does not divide the served model's {heads} attention heads ({source}); "
            f"use a serve.tp that divides {heads}"
        )
    longest = vllm_max_model_len(from_dict(ModelSpec, served))
    if v.max_model_len > longest:
        problems.append(
            f"serve.max_model_len={v.max_model_len} exceeds the {longest} tokens vLLM derives from {source} "
            f"(max_position_embeddings, rope_scaling); use serve.max_model_len<={longest}"
        )
    if v.expert_parallel and served["moe"] is None:
        problems.append(
            f"serve.expert_parallel=true but {source} is a dense model (no experts); use serve.expert_parallel=false"
        )
    return problems


def _differences(
    ours: Mapping[str, Any], theirs: Mapping[str, Any], prefix: str = ""
) -> Iterator[tuple[str, Any, Any]]:
    """(dotted key, spec value, config value) for each model key that differs; `name` is the spec's own."""
    for key in ours:
        if not prefix and key == "name":
            continue
        a, b = ours[key], theirs.get(key)
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            yield from _differences(a, b, f"{prefix}{key}.")
        elif a != b:
            yield f"{prefix}{key}", a, b


def _quantization_problems(spec: ServingSpec, quantization: Any, source: str) -> list[str]:
    """serve.quantization against the checkpoint's quantization_config.quant_method."""
    chosen = spec.serve.quantization
    method = quantization.get("quant_method") if isinstance(quantization, Mapping) else None
    if method is None:
        if chosen == COMPRESSED_TENSORS:
            return [
                f"serve.quantization={chosen} needs a checkpoint llm-compressor wrote, but {source} has no "
                f"{QUANTIZATION_CONFIG}; run `lmspec run BUILD --stage quantize`, or serve a compressed-tensors "
                "checkpoint, or use serve.quantization=null"
            ]
        if chosen in CALIBRATED:
            return [
                f"serve.quantization={chosen} needs a checkpoint calibrated for {chosen.upper()}, but {source} has "
                f"no {QUANTIZATION_CONFIG}; serve a {chosen.upper()} checkpoint, or use serve.quantization=null "
                "(or fp8, quantized by vLLM on load)"
            ]
        return []
    if method == chosen:
        return _scheme_problems(spec, quantization, source) if method == COMPRESSED_TENSORS else []
    if method not in QUANTIZATION_METHODS:
        return [
            f"{source} holds weights quantized as {method!r} ({QUANTIZATION_CONFIG}.quant_method), which "
            f"serve.quantization cannot say ({', '.join(QUANTIZATION_METHODS)}); serve a checkpoint in one of those"
        ]
    released = f"{source} holds weights released as {method} ({QUANTIZATION_CONFIG}.quant_method={method!r})"
    if chosen is None:
        return [
            f"serve.quantization=null but {released}: the memory budget priced {spec.serve.dtype} weights; "
            f"use serve.quantization={method}"
        ]
    return [f"serve.quantization={chosen} but {released}; use serve.quantization={method}"]


def _args_text(args: Mapping[str, Any]) -> str:
    return ", ".join(f"{field}={args.get(field)!r}" for field in COMPARED_ARGS)


def _scheme_problems(spec: ServingSpec, quantization: Mapping[str, Any], source: str) -> list[str]:
    """A compressed-tensors checkpoint of a quantizing spec against quantize: each config group's weights and
    input activations (lmspec.compiler.quantize_modules.checkpoint_scheme), and which layers it left unquantized
    (its `ignore`) against quantize.keep. A released checkpoint (quantize null) is served by its own scheme."""
    q = spec.quantize
    if q is None:
        return []
    what = f"quantize.scheme={q.scheme} (quantize.method={q.method}, quantize.group_size={q.group_size})"
    groups = quantization.get("config_groups")
    if not isinstance(groups, Mapping) or not groups:
        return [f"{source}: {QUANTIZATION_CONFIG} has no config_groups, so it is no checkpoint of {what}; {REQUANTIZE}"]
    expected = checkpoint_scheme(q)
    problems = []
    for name, group in sorted(groups.items()):
        for part, want in expected.items():
            have = group.get(part) if isinstance(group, Mapping) else None
            at = f"{QUANTIZATION_CONFIG}.config_groups.{name}.{part}"
            if want is None and have is None:
                continue
            if want is None or not isinstance(have, Mapping):
                found = "null" if not isinstance(have, Mapping) else _args_text(have)
                problems.append(
                    f"{source}: {at} is {found}, but {what} writes {'null' if want is None else _args_text(want)}; "
                    f"{REQUANTIZE}"
                )
                continue
            differing = [f for f in COMPARED_ARGS if have.get(f) != want[f]]
            if differing:
                found = ", ".join(f"{f}={have.get(f)!r} (the spec's {want[f]!r})" for f in differing)
                problems.append(f"{source}: {at} has {found}, not {what}; {REQUANTIZE}")
    ignore = quantization.get("ignore") or []
    if isinstance(ignore, list) and all(isinstance(entry, str) for entry in ignore):
        kept, left = kept_modules(spec), tuple(ignore)
        for linear in linear_modules(spec.model):
            if is_kept(linear, kept) != is_kept(linear, left):
                verb = "keeps" if is_kept(linear, kept) else "quantizes"
                done = "quantized" if is_kept(linear, kept) else "kept"
                problems.append(
                    f"{source}: the spec {verb} {linear.names[0]} (quantize.keep={list(kept)}), but the checkpoint "
                    f"{done} it ({QUANTIZATION_CONFIG}.ignore); {REQUANTIZE}"
                )
                break
    return problems
