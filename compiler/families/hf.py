"""The config.json keys every family's transformers config shares (Llama lineage, DeepSeek's MLA)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lmspec.compiler.families.family import Family
    from lmspec.compiler.spec.sections import ModelSpec


def rope_scaling(m: ModelSpec) -> dict[str, Any] | None:
    """config.json's `rope_scaling` of `m`: the legacy key transformers 5 reads into `rope_parameters`
    (with `rope_theta`) and vLLM reads through transformers' config; the spec's fields a type uses."""
    if m.rope_scaling is None:
        return None
    fields = dataclasses.asdict(m.rope_scaling)
    kind = fields.pop("type")
    return {"rope_type": kind, **{k: v for k, v in fields.items() if v is not None}}


def decoder_config(family: Family, m: ModelSpec, own: dict[str, Any]) -> dict[str, Any]:
    """config.json of `m` as `family`'s class: the shared decoder keys, MLA's when `m` has MLA,
    then the family's `own` keys (which win), sorted."""
    config: dict[str, Any] = {
        "architectures": [family.hf_class],
        "model_type": family.hf_model_type,
        "hidden_size": m.hidden_size,
        "intermediate_size": m.ffn_hidden_size,
        "num_hidden_layers": m.num_layers,
        "num_attention_heads": m.num_attention_heads,
        "num_key_value_heads": m.num_kv_heads,
        "head_dim": m.head_dim,
        "vocab_size": m.vocab_size,
        "max_position_embeddings": m.max_position_embeddings,
        "rms_norm_eps": m.norm_eps,
        "rope_theta": m.rope_theta,
        "rope_scaling": rope_scaling(m),
        "tie_word_embeddings": m.tie_embeddings,
        "hidden_act": "silu",
        "attention_bias": False,
        "initializer_range": 0.02,
        "use_cache": True,
    }
    if m.mla is not None:
        a = m.mla
        config.update(
            {
                "q_lora_rank": a.q_lora_rank,
                "kv_lora_rank": a.kv_lora_rank,
                "qk_nope_head_dim": a.qk_nope_head_dim,
                "qk_rope_head_dim": a.qk_rope_head_dim,
                "v_head_dim": a.v_head_dim,
                "head_dim": a.qk_rope_head_dim,
                "rope_interleave": True,
            }
        )
    return dict(sorted({**config, **own}.items()))
