"""HuggingFace models built from lmspec's model presets (configs only, nothing downloaded)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from compiler.load import compose_spec
from compiler.sections import ModelSpec, Spec
from compiler.typed import from_dict

MODEL_PRESETS = ("tiny", "tiny_moe", "llama3_8b", "llama3_70b", "mixtral_8x7b", "deepseek_v2_lite", "deepseek_v3")


def spec_of(*overrides: str) -> Spec:
    """The typed spec of a composition, without the semantic rules (tests probe layouts that fail them)."""
    return from_dict(Spec, compose_spec(list(overrides)).spec)


def hf_config(m: ModelSpec, attn_implementation: str = "eager") -> Any:
    """The transformers config of the same architecture, built from the spec's numbers."""
    import transformers

    common: dict[str, Any] = dict(
        vocab_size=m.vocab_size, hidden_size=m.hidden_size, num_hidden_layers=m.num_layers,
        num_attention_heads=m.num_attention_heads, num_key_value_heads=m.num_kv_heads,
        max_position_embeddings=m.max_position_embeddings, rms_norm_eps=m.norm_eps,
        tie_word_embeddings=m.tie_embeddings, attention_dropout=0.0, use_cache=False)
    if m.family == "llama":
        config = transformers.LlamaConfig(**common, intermediate_size=m.ffn_hidden_size, head_dim=m.head_dim,
                                          attention_bias=False, mlp_bias=False)
    elif m.family == "mixtral":
        assert m.moe is not None
        config = transformers.MixtralConfig(**common, intermediate_size=m.moe.ffn_hidden_size, head_dim=m.head_dim,
                                            num_local_experts=m.moe.num_experts, num_experts_per_tok=m.moe.top_k)
    else:
        assert m.mla is not None and m.moe is not None
        cls = transformers.DeepseekV3Config if m.family == "deepseek_v3" else transformers.DeepseekV2Config
        config = cls(**common, intermediate_size=m.ffn_hidden_size, moe_intermediate_size=m.moe.ffn_hidden_size,
                     n_shared_experts=m.moe.num_shared_experts, n_routed_experts=m.moe.num_experts,
                     num_experts_per_tok=m.moe.top_k, first_k_dense_replace=m.moe.first_dense_layers,
                     kv_lora_rank=m.mla.kv_lora_rank, q_lora_rank=m.mla.q_lora_rank,
                     qk_rope_head_dim=m.mla.qk_rope_head_dim, qk_nope_head_dim=m.mla.qk_nope_head_dim,
                     v_head_dim=m.mla.v_head_dim, n_group=1, topk_group=1)
    config._attn_implementation = attn_implementation
    return config


def hf_model(m: ModelSpec, device: str = "meta", attn_implementation: str = "eager") -> Any:
    import torch
    import transformers

    cls = {"llama": transformers.LlamaForCausalLM, "mixtral": transformers.MixtralForCausalLM,
           "deepseek_v2": transformers.DeepseekV2ForCausalLM, "deepseek_v3": transformers.DeepseekV3ForCausalLM}
    with torch.device(device):
        return cls[m.family](hf_config(m, attn_implementation))


@pytest.fixture
def build_hf_model() -> Callable[..., Any]:
    return hf_model
