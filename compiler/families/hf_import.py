"""Reading a released HF config.json into a model group: every field read or refused, none dropped.

A family's `Family.from_hf_config` reads its fields through `HfConfig`: `take` what lmspec keeps,
`expect` what must hold one value lmspec models (refused otherwise, naming the field), and
`decoder_fields` the keys every family shares (the inverse of lmspec.compiler.families.hf's
`decoder_config`); a field some releases state though lmspec derives it (`BUILT`) must equal what lmspec
builds. Whatever is left unread at the end that is not metadata (`METADATA`, `METADATA_PREFIXES`) is an
error naming the field: a silent approximation would train and serve a different model than the release.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from lmspec.compiler.errors import UsageError

# Fields that never change the computation lmspec trains or serves (token ids, dtype of the release,
# library versions, inference caches, training-time knobs lmspec sets from the spec's train section).
METADATA = frozenset(
    {
        "architectures",
        "model_type",
        "torch_dtype",
        "dtype",
        "transformers_version",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "use_cache",
        "initializer_range",
        "_name_or_path",
        "auto_map",
        "output_router_logits",
        "router_aux_loss_coef",
        "aux_loss_alpha",
        "seq_aux",
    }
)
# Prefixes of fields a re-uploader adds for its own bookkeeping (Unsloth's `unsloth_fixed`, `unsloth_version`).
METADATA_PREFIXES = ("unsloth_",)
# Fields some releases state although lmspec derives their value from the family and the fields it reads
# (Qwen3-Coder's `qkv_bias: false`, `use_qk_norm: true`, `shared_expert_intermediate_size: 0`): the field
# -> the value the group holds, which the release's must equal.
BUILT: dict[str, Callable[[dict[str, Any]], Any]] = {
    "qkv_bias": lambda group: group["qkv_bias"],
    "use_qk_norm": lambda group: group["qk_norm"],
    "shared_expert_intermediate_size": lambda group: (
        group["moe"]["num_shared_experts"] * group["moe"]["ffn_hidden_size"] if group["moe"] else 0
    ),
}


class ImportRefused(UsageError):
    """A config.json field lmspec cannot carry over exactly."""

    def __init__(self, field: str, why: str) -> None:
        super().__init__(f"config.json field {field}: {why}")
        self.field = field


class HfConfig:
    """A config.json being read: each field is read once (take/expect), the rest is checked by `unread`."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        self._config = dict(config)
        self._read: set[str] = set()

    def has(self, field: str) -> bool:
        return field in self._config

    def take(self, field: str, default: Any = ...) -> Any:
        """The field's value (marked read); `default` where the field is absent, an error without one."""
        self._read.add(field)
        if field in self._config:
            return self._config[field]
        if default is ...:
            raise ImportRefused(field, "is missing, and lmspec has no default for it")
        return default

    def expect(self, field: str, *allowed: Any, why: str) -> Any:
        """The field's value, which must be one of `allowed` where present (absent reads as allowed[0])."""
        value = self.take(field, allowed[0])
        if value not in allowed:
            shown = " or ".join(repr(a) for a in allowed)
            raise ImportRefused(field, f"is {value!r}; lmspec models only {shown} ({why})")
        return value

    def unread(self) -> list[str]:
        """Fields neither read nor metadata, in file order."""
        return [
            k for k in self._config if k not in self._read and k not in METADATA and not k.startswith(METADATA_PREFIXES)
        ]

    def expect_built(self, group: dict[str, Any], family: str) -> None:
        """Read each field of `BUILT` the release states: it must equal the value `group` holds."""
        for field, built in BUILT.items():
            if field in self._config and field not in self._read:
                value = self.take(field)
                if value != built(group):
                    raise ImportRefused(
                        field, f"is {value!r}; lmspec's {family} builds {built(group)!r} from the other fields"
                    )


def rope(config: HfConfig) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, model.rope_scaling) from the legacy fields (`rope_theta`, `rope_scaling`) or
    transformers 5's `rope_parameters`; a scaling type lmspec does not model is refused."""
    import dataclasses

    from lmspec.compiler.spec.sections import ROPE_SCALING_FIELDS, RopeScalingSpec  # sections imports families

    if config.has("rope_parameters"):
        params = dict(config.take("rope_parameters"))
        theta = params.pop("rope_theta")
        scaling: dict[str, Any] | None = params if params.get("rope_type", "default") != "default" else None
    else:
        theta = config.take("rope_theta", 10000.0)
        scaling = config.take("rope_scaling", None)
    if scaling is None:
        return float(theta), None
    scaling = dict(scaling)
    kind = scaling.pop("rope_type", None) or scaling.pop("type", None)
    scaling.pop("type", None)
    if kind not in ROPE_SCALING_FIELDS:
        raise ImportRefused(
            "rope_scaling", f"type {kind!r} is not one lmspec models ({', '.join(ROPE_SCALING_FIELDS)})"
        )
    read = ("factor", *ROPE_SCALING_FIELDS[kind])
    extra = sorted(set(scaling) - set(read))
    if extra:
        raise ImportRefused(f"rope_scaling.{extra[0]}", f"is not a field of rope_scaling type {kind} lmspec models")
    out: dict[str, Any] = dict.fromkeys(f.name for f in dataclasses.fields(RopeScalingSpec))
    out.update({"type": kind, **{k: scaling[k] for k in read if k in scaling}})
    missing = [k for k in read if out.get(k) is None]
    if missing:
        raise ImportRefused(f"rope_scaling.{missing[0]}", f"is missing; rope_scaling type {kind} needs it")
    return float(theta), {
        k: (float(v) if isinstance(v, int) and k != "original_max_position_embeddings" else v) for k, v in out.items()
    }


def decoder_fields(config: HfConfig) -> dict[str, Any]:
    """The model-group keys every family shares, GQA attention and a dense model assumed (a family with
    MLA or experts overwrites `attention`/`mla`/`moe` and the fields it reads)."""
    hidden, heads = int(config.take("hidden_size")), int(config.take("num_attention_heads"))
    config.expect("hidden_act", "silu", why="lmspec's MLPs are SwiGLU")
    config.expect("attention_dropout", 0.0, why="lmspec trains without attention dropout")
    config.expect("pretraining_tp", 1, why="a slicing knob of Llama's original code; values > 1 change the rounding")
    theta, scaling = rope(config)
    return {
        "num_layers": int(config.take("num_hidden_layers")),
        "hidden_size": hidden,
        "ffn_hidden_size": int(config.take("intermediate_size")),
        "num_attention_heads": heads,
        "num_kv_heads": int(config.take("num_key_value_heads", heads)),
        "head_dim": int(config.take("head_dim", None) or hidden // heads),
        "vocab_size": int(config.take("vocab_size")),
        "max_position_embeddings": int(config.take("max_position_embeddings")),
        "attention": "gqa",
        "mla": None,
        "moe": None,
        "norm_eps": float(config.take("rms_norm_eps")),
        "rope_theta": theta,
        "rope_scaling": scaling,
        "qkv_bias": False,
        "qk_norm": False,
        "tie_embeddings": bool(config.take("tie_word_embeddings", False)),
        "mtp_layers": 0,
    }


def inert_attention_bias(config: HfConfig) -> None:
    """Read `attention_bias` of a transformers class that has no such option (Mistral, Mixtral, Qwen2: their
    biases are fixed by the architecture): lmspec's own config.json (families.hf.decoder_config) writes it for
    every family, and a model lmspec converted must import (and serve, compiler/serve_config.py) as itself."""
    config.take("attention_bias", None)


def full_attention(config: HfConfig) -> None:
    """Read the sliding-window fields of the Mistral/Qwen configs: lmspec's attention is full causal, so
    a window that applies is refused; Qwen's window sizes, unused under `use_sliding_window: false`
    (transformers then builds every layer full), are read as the metadata they are there."""
    why = "lmspec's attention is full causal over the sequence; a sliding window would train a different model"
    windowed = config.has("use_sliding_window")
    if windowed:
        config.expect("use_sliding_window", False, why=why)
        config.take("sliding_window", None)
        config.take("max_window_layers", None)
    elif config.take("sliding_window", None) is not None:
        raise ImportRefused("sliding_window", f"is {config.take('sliding_window')!r}; {why} (null is accepted)")
    kinds = set(config.take("layer_types", None) or ["full_attention"])
    if kinds != {"full_attention"}:
        raise ImportRefused("layer_types", f"has {sorted(kinds - {'full_attention'})}; {why}")
