"""The `model` group: the architecture of a decoder-only transformer and its optional parts (MLA,
MoE, RoPE scaling), as the presets in specs/model/ and `lmspec import` write it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from lmspec.compiler.families import FamilyName
from lmspec.compiler.spec import kinds
from lmspec.compiler.spec.sections.declare import key


@dataclass(frozen=True, kw_only=True)
class MlaSpec:
    """Multi-head latent attention (DeepSeek-V2/V3): low-rank compressed K/V (and Q)."""

    q_lora_rank: int | None = key(
        "Rank of the query down-projection; null = no query compression (V2-Lite).",
        example=1536,
        minimum=1,
        maximum=kinds.WIDTH_MAX,
    )
    kv_lora_rank: int = key(
        "Rank of the joint key/value down-projection (the latent cached by vLLM).",
        example=512,
        minimum=1,
        maximum=kinds.WIDTH_MAX,
    )
    qk_nope_head_dim: int = key(
        "Per-head query/key dimension without rotary embedding.", example=128, minimum=1, maximum=kinds.WIDTH_MAX
    )
    qk_rope_head_dim: int = key(
        "Per-head query/key dimension carrying rotary embedding (shared key across heads).",
        example=64,
        minimum=1,
        maximum=kinds.WIDTH_MAX,
    )
    v_head_dim: int = key("Per-head value dimension.", example=128, minimum=1, maximum=kinds.WIDTH_MAX)


@dataclass(frozen=True, kw_only=True)
class MoeSpec:
    """Mixture-of-experts MLP block."""

    num_experts: int = key("Routed experts per MoE layer.", example=256, minimum=1, maximum=kinds.EXPERTS_MAX)
    top_k: int = key("Routed experts each token is sent to.", example=8, minimum=1, maximum=kinds.EXPERTS_MAX)
    num_shared_experts: int = key(
        "Always-active shared experts per MoE layer (DeepSeek); 0 for Mixtral.",
        example=1,
        minimum=0,
        maximum=kinds.EXPERTS_MAX,
    )
    ffn_hidden_size: int = key(
        "Intermediate size of one expert's gated MLP.", example=2048, minimum=1, maximum=kinds.WIDTH_MAX
    )
    first_dense_layers: int = key(
        "Leading layers that use the dense MLP instead of MoE.", example=3, minimum=0, maximum=kinds.LAYERS_MAX
    )
    router_score_bias: bool = key(
        "Router keeps a per-expert score-correction bias (DeepSeek-V3 aux-loss-free balancing).", example=True
    )
    router_score_function: Literal["softmax", "sigmoid"] = key(
        "How the router scores experts: softmax (Mixtral, Qwen3-MoE, DeepSeek-V2) or sigmoid (DeepSeek-V3; HF"
        " scoring_func).",
        example="sigmoid",
    )
    router_num_groups: int | None = key(
        "Expert groups of group-limited routing (HF n_group; DeepSeek-V3: 8); null = no groups.",
        example=8,
        minimum=1,
        maximum=kinds.EXPERTS_MAX,
    )
    router_group_topk: int | None = key(
        "Groups each token may route into (HF topk_group; DeepSeek-V3: 4); set exactly when router_num_groups is.",
        example=4,
        minimum=1,
        maximum=kinds.EXPERTS_MAX,
    )
    routed_scaling_factor: float = key(
        "Factor on the routed experts' combined output (HF routed_scaling_factor; DeepSeek-V3: 2.5).",
        example=2.5,
        exclusive_minimum=0,
        maximum=kinds.SCALE_MAX,
    )
    norm_topk_prob: bool = key(
        "Renormalise the top-k routing weights to sum to 1 (HF norm_topk_prob; DeepSeek-V2-Lite: false).",
        example=True,
    )


# The rope_scaling fields each type reads besides `factor` (HF's rope_scaling keys of that type); a spec
# leaves the others null (rule rope_scaling_fields_match_type), an import refuses them.
ROPE_SCALING_FIELDS: dict[str, tuple[str, ...]] = {
    "llama3": ("original_max_position_embeddings", "low_freq_factor", "high_freq_factor"),
    "yarn": ("original_max_position_embeddings", "beta_fast", "beta_slow", "mscale", "mscale_all_dim"),
    "linear": (),
}


@dataclass(frozen=True, kw_only=True)
class RopeScalingSpec:
    """RoPE context extension as the released config.json states it (HF `rope_scaling`); the fields a
    type does not use stay null."""

    type: Literal["llama3", "yarn", "linear"] = key(
        "llama3 (Llama-3.1's frequency-band scaling), yarn (DeepSeek's) or linear (position interpolation).",
        example="llama3",
    )
    factor: float = key("Context extension factor.", example=8.0, exclusive_minimum=0, maximum=kinds.SCALE_MAX)
    original_max_position_embeddings: int | None = key(
        "Context length the model was pretrained at (llama3, yarn); null for linear.",
        example=8192,
        minimum=1,
        maximum=kinds.TOKENS_MAX,
    )
    low_freq_factor: float | None = key(
        "llama3: wavelengths above original/low_freq_factor are scaled fully.",
        example=1.0,
        exclusive_minimum=0,
        maximum=kinds.SCALE_MAX,
    )
    high_freq_factor: float | None = key(
        "llama3: wavelengths below original/high_freq_factor stay unscaled.",
        example=4.0,
        exclusive_minimum=0,
        maximum=kinds.SCALE_MAX,
    )
    beta_fast: float | None = key(
        "yarn: fast rotation boundary.", example=32.0, exclusive_minimum=0, maximum=kinds.SCALE_MAX
    )
    beta_slow: float | None = key(
        "yarn: slow rotation boundary.", example=1.0, exclusive_minimum=0, maximum=kinds.SCALE_MAX
    )
    mscale: float | None = key(
        "yarn: attention temperature coefficient.", example=1.0, minimum=0, maximum=kinds.SCALE_MAX
    )
    mscale_all_dim: float | None = key(
        "yarn: the temperature coefficient applied to every dimension.", example=1.0, minimum=0, maximum=kinds.SCALE_MAX
    )


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """Architecture of a decoder-only transformer (pre-norm, RMSNorm, SwiGLU, RoPE)."""

    name: str = key("Preset name; also the default build name.", example="llama3_8b", kind=kinds.PLAIN_NAME)
    family: FamilyName = key("HuggingFace architecture family used for conversion and serving.", example="llama")
    num_layers: int = key("Transformer layers.", example=32, minimum=1, maximum=kinds.LAYERS_MAX)
    hidden_size: int = key("Model (residual stream) width.", example=4096, minimum=1, maximum=kinds.WIDTH_MAX)
    ffn_hidden_size: int = key(
        "Intermediate size of the dense gated MLP.", example=14336, minimum=1, maximum=kinds.WIDTH_MAX
    )
    num_attention_heads: int = key("Query heads.", example=32, minimum=1, maximum=kinds.HEADS_MAX)
    num_kv_heads: int = key(
        "Key/value heads (GQA); equal to heads for MHA and MLA.", example=8, minimum=1, maximum=kinds.HEADS_MAX
    )
    head_dim: int = key(
        "Per-head query/key width; for MLA qk_nope_head_dim + qk_rope_head_dim.",
        example=128,
        minimum=1,
        maximum=kinds.WIDTH_MAX,
    )
    vocab_size: int = key(
        "Vocabulary size (rows of the embedding and output head).", example=128256, minimum=1, maximum=kinds.VOCAB_MAX
    )
    max_position_embeddings: int = key(
        "Longest sequence the positional encoding is trained for.", example=8192, minimum=1, maximum=kinds.TOKENS_MAX
    )
    attention: Literal["gqa", "mla"] = key(
        "Attention kind: gqa (covers MHA when kv heads = heads) or mla.", example="gqa"
    )
    mla: MlaSpec | None = key("MLA ranks; required when attention is mla, null otherwise.", example=None)
    moe: MoeSpec | None = key("Mixture-of-experts block; null for a dense model.", example=None)
    norm_eps: float = key("RMSNorm epsilon.", example=1e-5, exclusive_minimum=0, maximum=kinds.EPS_MAX)
    rope_theta: float = key("RoPE base frequency.", example=500000.0, exclusive_minimum=0, maximum=kinds.ROPE_THETA_MAX)
    rope_scaling: RopeScalingSpec | None = key(
        "RoPE context extension (Llama-3.1: llama3; DeepSeek: yarn); null = plain RoPE.", example=None
    )
    qkv_bias: bool = key("Bias on the query, key and value projections, none on the output (Qwen2).", example=False)
    qk_norm: bool = key("Per-head RMSNorm on queries and keys before RoPE (Qwen3).", example=False)
    tie_embeddings: bool = key("Output head shares the input embedding matrix.", example=False)
    mtp_layers: int = key(
        "Multi-token-prediction modules (DeepSeek-V3: 1); counted apart from the model's size.",
        example=0,
        minimum=0,
        maximum=kinds.LAYERS_MAX,
    )
