"""What a quantized model is: which of its linear layers llm-compressor quantizes, and what each then weighs.

One owner for the quantize rules, the serving models (memory, step time), REPORT.md and the quantize stage:

- `linear_modules`: every linear layer of the HF model the way llm-compressor sees it (its `targets:
  ["Linear"]`), named by the model family's conversion rows (lmspec.compiler.families), so a release's own
  names (`model.layers.3.mlp.gate`, `block_sparse_moe.experts.0.w1`) are the ones matched;
- `kept_modules`: what stays in the model's dtype, llm-compressor's `ignore` list: quantize.keep, or the
  output head and every MoE router under the family's names;
- `matches`: compressed-tensors' own test of a pattern against a module name (vLLM's
  `is_equal_or_regex_match`): the name itself, or `re:` and a regular expression `re.match`ed at its start;
- `checkpoint_scheme`: the weights' and activations' arguments the checkpoint's config.json records;
- `bytes_per_weight` and `quantized_model`: the bytes of each part's weights with their scales.

Pure: no torch, no llm-compressor, no vLLM; the runtime imports it (lmspec.compiler.contract allows it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal

from lmspec.compiler.conversion.kinds import SplitKind
from lmspec.compiler.conversion.mapping import shape_table
from lmspec.compiler.conversion.rows import OUTPUT, Row
from lmspec.compiler.families import FAMILIES
from lmspec.compiler.models.units import FP32_BYTES
from lmspec.compiler.spec.kinds import MODULE_PATTERN_PREFIX
from lmspec.compiler.spec.sections import ModelSpec, QuantizeSpec, Spec

COMPRESSED_TENSORS = "compressed-tensors"  # serve.quantization (vLLM's --quantization) of llm-compressor's checkpoints
Part = Literal["attention", "mla_down", "dense_mlp", "experts", "router", "head"]
# The part of the model each linear conversion row's shape belongs to (lmspec.compiler.conversion.mapping's
# shape table); MLA's down-projections apart from the rest of attention: vLLM keeps them whole on every
# tensor-parallel rank (lmspec.compiler.models.serve_memory.replicated_params).
PART_OF_SHAPE: dict[str, Part] = {
    "qkv": "attention",
    "o_proj": "attention",
    "q_proj": "attention",
    "q_up": "attention",
    "kv_up": "attention",
    "q_down": "mla_down",
    "kv_down": "mla_down",
    "fc1": "dense_mlp",
    "fc2": "dense_mlp",
    "shared_fc1": "dense_mlp",
    "shared_fc2": "dense_mlp",
    "expert_fc1": "experts",
    "expert_fc2": "experts",
    "router": "router",
}
QUANTIZED_PARTS: tuple[Part, ...] = ("attention", "mla_down", "dense_mlp", "experts")  # what a scheme may quantize
HEAD = OUTPUT.hf[0].removesuffix(".weight")  # the output head's module: lm_head
WEIGHT = ".weight"
LAYER_PREFIX = "model.layers.{layer}."  # the HF decoder layers' module names (lmspec.compiler.conversion.mapping)
EXPERT_SHOWN = "0"  # a layer's routed experts are named after expert 0: every expert has the same modules
BITS_PER_BYTE = 8
# The 8-bit schemes' scales are fp32 (vLLM holds them so); w4a16's are in the model's dtype, one per group.
EIGHT_BIT_SCALE_BYTES = FP32_BYTES
# AWQ is asymmetric: a 4-bit zero point per group beside each scale, packed like the weights.
ZERO_POINT_BITS = 4
# compressed-tensors' QuantizationArgs of each scheme as llm-compressor's presets write them (compressed-tensors
# 0.19, read from its quant_scheme.py): FP8 (weights one scale per tensor, activations one static scale per
# tensor), FP8_DYNAMIC (per output channel; per token at run time), W8A8 (int, the same strategies); w4a16 is
# W4A16 (symmetric) or, for AWQ, W4A16_ASYM, with quantize.group_size (`_w4a16`).
_INT8 = {"num_bits": 8, "type": "int", "strategy": "channel", "group_size": None, "symmetric": True, "dynamic": False}
_FP8 = {**_INT8, "type": "float"}
EIGHT_BIT_SCHEMES: dict[str, dict[str, dict[str, Any]]] = {
    "fp8": {"weights": {**_FP8, "strategy": "tensor"}, "input_activations": {**_FP8, "strategy": "tensor"}},
    "fp8_dynamic": {"weights": _FP8, "input_activations": {**_FP8, "strategy": "token", "dynamic": True}},
    "int8": {"weights": _INT8, "input_activations": {**_INT8, "strategy": "token", "dynamic": True}},
}


@dataclass(frozen=True)
class Linear:
    """One linear layer of the HF model (several, for a layer's routed experts: `copies`)."""

    names: tuple[str, ...]  # HF module names of its shards: vLLM fuses q/k/v and gate/up into one layer
    part: Part
    shape: str  # its key in lmspec.compiler.conversion.mapping.shape_table
    split: SplitKind  # how tensor parallelism splits it (column: its outputs, row: its inputs)
    out_features: int  # every shard together
    in_features: int
    copies: int = 1  # the routed experts of a layer, named after expert 0

    @property
    def params(self) -> int:
        return self.out_features * self.in_features * self.copies


def _module(prefix: str, hf: str) -> str:
    return prefix + hf.removesuffix(WEIGHT).replace("{e}", EXPERT_SHOWN)


def _linears(m: ModelSpec, rows: list[Row], prefix: str, copies: int) -> list[Linear]:
    shapes = shape_table(m)
    out = []
    for row in rows:
        part = PART_OF_SHAPE.get(row.shape)
        if part is None or not row.hf[0].endswith(WEIGHT):  # norms, biases, the router's score bias
            continue
        features, inputs = shapes[row.shape]
        names = tuple(_module(prefix, hf) for hf in row.hf)
        out.append(Linear(names, part, row.shape, row.kind, features, inputs, copies))
    return out


@lru_cache(maxsize=16)
def linear_modules(m: ModelSpec) -> tuple[Linear, ...]:
    """Every linear layer of the HF model, layer by layer, then the output head: what llm-compressor's
    `targets: ["Linear"]` reaches (the embedding is a lookup, the norms are no Linear; MTP modules are
    not loaded by transformers, so llm-compressor never sees them). Cached: read it, do not change it."""
    family = FAMILIES[m.family]
    found: list[Linear] = []
    for layer in range(m.num_layers):
        prefix = LAYER_PREFIX.format(layer=layer)
        rows, expert_rows = family.layer_rows(m, layer)
        found += _linears(m, rows, prefix, 1)
        found += _linears(m, expert_rows, prefix, m.moe.num_experts if m.moe else 1)
    vocab, hidden = shape_table(m)[OUTPUT.shape]
    found.append(Linear((HEAD,), "head", OUTPUT.shape, OUTPUT.kind, vocab, hidden))
    return tuple(found)


def _in_layer(name: str) -> str:
    """A decoder layer's module name after `model.layers.N.`."""
    return name.split(".", 3)[3]


def _pattern(text: str, tail: str) -> str:
    """`re:.*` + `text` with its dots as `[.]` + `tail`: the style of llm-compressor's examples."""
    return MODULE_PATTERN_PREFIX + ".*" + re.escape(text).replace(r"\.", "[.]") + tail


def router_patterns(m: ModelSpec) -> tuple[str, ...]:
    """`re:` patterns naming every MoE router of the model by its family's names (`re:.*mlp[.]gate$`,
    Mixtral's `re:.*block_sparse_moe[.]gate$`); none for a dense model."""
    found = {_in_layer(name): None for linear in linear_modules(m) if linear.part == "router" for name in linear.names}
    return tuple(_pattern(suffix, "$") for suffix in found)


def expert_patterns(m: ModelSpec) -> tuple[str, ...]:
    """`re:` patterns naming every routed expert's layers by the family's names (`re:.*mlp[.]experts[.].*`,
    Mixtral's `re:.*block_sparse_moe[.]experts[.].*`): what keeps the experts in the model's dtype."""
    marker = f".{EXPERT_SHOWN}."
    found = {
        _in_layer(name).split(marker)[0] + ".": None
        for linear in linear_modules(m)
        if linear.part == "experts"
        for name in linear.names
    }
    return tuple(_pattern(prefix, ".*") for prefix in found)


def default_kept(m: ModelSpec) -> tuple[str, ...]:
    """What quantize.keep=null keeps: the output head and every MoE router."""
    return (HEAD, *router_patterns(m))


def kept_modules(spec: Spec) -> tuple[str, ...]:
    """llm-compressor's `ignore` list of a quantizing spec (quantize set): quantize.keep, or default_kept."""
    q = spec.quantize
    assert q is not None, "only a spec that quantizes keeps modules"
    return tuple(q.keep) if q.keep is not None else default_kept(spec.model)


def matches(pattern: str, name: str) -> bool:
    """compressed-tensors' (and vLLM's) test of one `ignore` entry against a module name."""
    if pattern.startswith(MODULE_PATTERN_PREFIX):
        return re.match(pattern[len(MODULE_PATTERN_PREFIX) :], name) is not None
    return pattern == name


def kept_shards(linear: Linear, patterns: tuple[str, ...]) -> tuple[str, ...]:
    """The shards of `linear` some pattern keeps."""
    return tuple(name for name in linear.names if any(matches(p, name) for p in patterns))


def is_kept(linear: Linear, patterns: tuple[str, ...]) -> bool:
    """Whether the layer stays in the model's dtype: vLLM ignores a fused layer only when every shard is
    (`should_ignore_layer`; a layer kept in part is refused by lmspec.compiler.rules.quantize)."""
    return len(kept_shards(linear, patterns)) == len(linear.names)


def checkpoint_scheme(q: QuantizeSpec) -> dict[str, dict[str, Any] | None]:
    """The `weights` and `input_activations` (None: not quantized) of the config group the quantize stage's
    checkpoint records in config.json (quantization_config.config_groups), as llm-compressor writes them."""
    if q.scheme != "w4a16":
        return dict(EIGHT_BIT_SCHEMES[q.scheme])
    weights = {
        "num_bits": 4,
        "type": "int",
        "strategy": "group" if q.group_size else "channel",
        "group_size": q.group_size,
        "symmetric": q.method != "awq",
        "dynamic": False,
    }
    return {"weights": weights, "input_activations": None}


def bytes_per_weight(q: QuantizeSpec, in_features: int, dtype_bytes: int) -> float:
    """Bytes one weight of a quantized linear layer takes with its share of the scales (and AWQ's zero points):
    w4a16 half a byte plus a scale in the model's dtype per group_size inputs (per output channel when
    null); fp8_dynamic and int8 one byte plus an fp32 scale per output channel; static fp8 one byte (its one
    weight scale and one input scale per layer, 8 bytes, are left out)."""
    weights = checkpoint_scheme(q)["weights"]
    assert weights is not None, "every scheme quantizes the weights"
    weight = weights["num_bits"] / BITS_PER_BYTE
    if weights["strategy"] == "tensor":
        return weight
    if q.scheme != "w4a16":
        return weight + EIGHT_BIT_SCALE_BYTES / in_features
    group = q.group_size or in_features
    zero = 0.0 if weights["symmetric"] else ZERO_POINT_BITS / BITS_PER_BYTE
    return weight + (dtype_bytes + zero) / group


@dataclass(frozen=True, kw_only=True)
class PartWeights:
    """The linear weights of one part of the model: parameters, those quantized, and bytes with their scales."""

    params: int
    quantized_params: int
    bytes: float

    @property
    def quantized_share(self) -> float:
        return self.quantized_params / self.params if self.params else 0.0


@dataclass(frozen=True, kw_only=True)
class QuantizedModel:
    """The linear weights of the checkpoint quantize.output holds, by part (lm_head and routers are kept)."""

    attention: PartWeights  # MLA's down-projections apart
    mla_down: PartWeights
    dense_mlp: PartWeights  # dense layers' MLPs and shared experts
    experts: PartWeights  # every routed expert

    def part(self, name: Part) -> PartWeights:
        weights: PartWeights = getattr(self, name)
        return weights


@lru_cache(maxsize=16)
def _quantized_model(m: ModelSpec, q: QuantizeSpec, kept: tuple[str, ...], dtype_bytes: int) -> QuantizedModel:
    params = dict.fromkeys(QUANTIZED_PARTS, 0)
    quantized = dict.fromkeys(QUANTIZED_PARTS, 0)
    size = dict.fromkeys(QUANTIZED_PARTS, 0.0)
    for linear in linear_modules(m):
        if linear.part not in params:  # the output head and the routers: kept (rules.quantize)
            continue
        params[linear.part] += linear.params
        if is_kept(linear, kept):
            size[linear.part] += linear.params * dtype_bytes
        else:
            quantized[linear.part] += linear.params
            size[linear.part] += linear.params * bytes_per_weight(q, linear.in_features, dtype_bytes)
    parts = {p: PartWeights(params=params[p], quantized_params=quantized[p], bytes=size[p]) for p in QUANTIZED_PARTS}
    return QuantizedModel(**parts)


def quantized_model(spec: Spec, dtype_bytes: int) -> QuantizedModel:
    """Each part's linear weights in the quantized checkpoint of a quantizing spec; `dtype_bytes` per weight of a
    kept layer (and per w4a16 scale): the converted model's dtype."""
    q = spec.quantize
    assert q is not None, "only a spec that quantizes has a quantized model"
    return _quantized_model(spec.model, q, kept_modules(spec), dtype_bytes)


def quantize_dict(spec: Spec, dtype_bytes: int) -> dict[str, Any]:
    """What plan.json and `lmspec explain` show of a quantizing spec: the layers kept (llm-compressor's
    `ignore`), each part's quantized share of its linear weights, and those weights' bytes before and after."""
    model = quantized_model(spec, dtype_bytes)
    parts = {p: model.part(p) for p in QUANTIZED_PARTS if model.part(p).params}
    return {
        "kept": list(kept_modules(spec)),
        "quantized_share": {p: round(w.quantized_share, 6) for p, w in parts.items()},
        "linear_bytes_unquantized": sum(w.params for w in parts.values()) * dtype_bytes,
        "linear_bytes": round(sum(w.bytes for w in parts.values())),
    }
