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
from lmspec.compiler.spec.sections import ModelSpec, ServeSpec, ServingSpec
from lmspec.compiler.spec.typed import from_dict

QUANTIZATION_CONFIG = "quantization_config"  # HF's record of how released weights are quantized
CALIBRATED = ("awq", "gptq")  # methods whose scales come from calibration: only a checkpoint that has them
QUANTIZATION_METHODS: tuple[str, ...] = tuple(  # serve.quantization's values, from its Literal | None
    m for arg in typing.get_args(typing.get_type_hints(ServeSpec)["quantization"]) for m in typing.get_args(arg)
)


def served_config_problems(spec: ServingSpec, config: Mapping[str, Any]) -> list[str]:
    """Every way `config` (serve.model_path's config.json) contradicts `spec`; empty when it is the spec's model."""
    source = f"{spec.serve.model_path or 'the served model'}/config.json"
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
        if chosen in CALIBRATED:
            return [
                f"serve.quantization={chosen} needs a checkpoint calibrated for {chosen.upper()}, but {source} has "
                f"no {QUANTIZATION_CONFIG}; serve a {chosen.upper()} checkpoint, or use serve.quantization=null "
                "(or fp8, quantized by vLLM on load)"
            ]
        return []
    if method == chosen:
        return []
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
