"""The megatron-core TransformerConfig arguments every family shares: RMSNorm, SwiGLU, RoPE, no
biases but the q/k/v one where the model has it; GQA via `num_query_groups` (per-head q/k RMSNorm where
the model has it) or MLA with RMSNorm on the q/kv latents; MoE with top-k routing, shared experts and
the first `moe.first_dense_layers` layers dense. How a MoE model trains (dispatcher, load balancing,
capacity, router dtype, kernels) is train.moe's, written by lmspec.compiler.backends.megatron_config."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lmspec.compiler.families.family import MegatronConfig

if TYPE_CHECKING:
    from lmspec.compiler.spec.sections import ModelSpec


def _moe_kwargs(m: ModelSpec) -> dict[str, Any]:
    moe = m.moe
    if moe is None:
        return {}
    kwargs: dict[str, Any] = {
        "num_moe_experts": moe.num_experts,
        "moe_router_topk": moe.top_k,
        "moe_ffn_hidden_size": moe.ffn_hidden_size,
        "moe_layer_freq": [0] * moe.first_dense_layers + [1] * (m.num_layers - moe.first_dense_layers),
        "moe_router_score_function": moe.router_score_function,
        "moe_router_enable_expert_bias": moe.router_score_bias,
        # softmax over the top-k logits renormalises them (HF norm_topk_prob); softmax over all experts first does not
        "moe_router_pre_softmax": moe.router_score_function == "softmax" and not moe.norm_topk_prob,
        "moe_router_num_groups": moe.router_num_groups,  # group-limited routing (DeepSeek-V3: 8 groups, top 4)
        "moe_router_group_topk": moe.router_group_topk,
        "moe_router_topk_scaling_factor": moe.routed_scaling_factor,
    }
    if moe.num_shared_experts:
        kwargs["moe_shared_expert_intermediate_size"] = moe.num_shared_experts * moe.ffn_hidden_size
    return kwargs


def _mla_rope(m: ModelSpec) -> dict[str, Any]:
    """MLA's rope: plain, or YaRN (megatron-core's YarnRotaryEmbedding: the cos/sin scaled by
    mscale(factor, mscale) / mscale(factor, mscale_all_dim), the softmax by mscale(factor, mscale_all_dim)^2,
    as transformers' DeepseekV2/V3 do); DeepSeek.refusals refuses the other rope_scaling types."""
    rs = m.rope_scaling
    if rs is None:
        return {"rope_type": "rope"}
    assert rs.type == "yarn", "DeepSeek.refusals: MLA rope_scaling is yarn or null"
    return {
        "rope_type": "yarn",
        "rotary_scaling_factor": rs.factor,
        "original_max_position_embeddings": rs.original_max_position_embeddings,
        "beta_fast": rs.beta_fast,
        "beta_slow": rs.beta_slow,
        "mscale": rs.mscale,
        "mscale_all_dim": rs.mscale_all_dim,
    }


def decoder_config(m: ModelSpec) -> MegatronConfig:
    """The TransformerConfig arguments of `m`."""
    kwargs: dict[str, Any] = {
        "num_layers": m.num_layers,
        "hidden_size": m.hidden_size,
        "ffn_hidden_size": m.ffn_hidden_size,
        "num_attention_heads": m.num_attention_heads,
        "kv_channels": m.head_dim,
        "normalization": "RMSNorm",
        "layernorm_epsilon": m.norm_eps,
        "gated_linear_unit": True,
        "add_bias_linear": False,
        "add_qkv_bias": m.qkv_bias,
        **_moe_kwargs(m),
    }
    if m.attention != "mla":
        gqa = {"num_query_groups": m.num_kv_heads, "qk_layernorm": m.qk_norm}
        return MegatronConfig("TransformerConfig", {**kwargs, **gqa}, activation="silu")
    assert m.mla is not None, "validate() requires model.mla with attention=mla"
    mla = {
        "num_query_groups": m.num_attention_heads,
        "qk_layernorm": True,  # DeepSeek's RMSNorm on the q and kv latents
        "q_lora_rank": m.mla.q_lora_rank,
        "kv_lora_rank": m.mla.kv_lora_rank,
        "qk_head_dim": m.mla.qk_nope_head_dim,
        "qk_pos_emb_head_dim": m.mla.qk_rope_head_dim,
        "v_head_dim": m.mla.v_head_dim,
        "rotary_base": m.rope_theta,
        **_mla_rope(m),
    }
    return MegatronConfig("MLATransformerConfig", {**kwargs, **mla}, activation="silu")
