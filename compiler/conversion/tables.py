"""Per-family mapping tables: Megatron checkpoint name -> running-model name -> HF name(s), kind.

Megatron names are megatron-core 0.16.1's, read from real models built with the local
layer spec (runtime/train/megatron/model.py) and from their dist_checkpointing metadata, not
guessed. Two name spaces differ: the running model's state_dict (what the reverse
conversion copies into) and the checkpoint (what `convert` reads). The GQA layer spec
saves its norms under Transformer Engine's names (`linear_qkv.layer_norm_weight`); the
MLA spec does not rename them. `{e}` is the global expert id, `{i}` the local one.
HF names are the released checkpoints' (transformers 5 fuses experts at load time).
"""

from __future__ import annotations

from typing import NamedTuple

from lmspec.compiler.conversion.kinds import SplitKind as K


class Row(NamedTuple):
    checkpoint: str  # dist-checkpoint key suffix
    model: str  # running model state_dict key suffix
    hf: tuple[str, ...]  # HF name suffix(es)
    kind: K
    shape: str  # key into the family's shape table (compiler/conversion/mapping.py)


# -- whole-model tensors (every family) -----------------------------------------------------------
EMBEDDING = Row(
    "embedding.word_embeddings.weight",
    "embedding.word_embeddings.weight",
    ("model.embed_tokens.weight",),
    K.COLUMN,
    "vocab",
)
FINAL_NORM = Row(
    "decoder.final_layernorm.weight", "decoder.final_layernorm.weight", ("model.norm.weight",), K.REPLICATED, "hidden"
)
OUTPUT = Row("output_layer.weight", "output_layer.weight", ("lm_head.weight",), K.COLUMN, "vocab")

# -- attention, per layer ----------------------------------------------------------------------
GQA_ATTENTION = (
    Row(
        "self_attention.linear_qkv.layer_norm_weight",
        "input_layernorm.weight",
        ("input_layernorm.weight",),
        K.REPLICATED,
        "hidden",
    ),
    Row(
        "self_attention.linear_qkv.weight",
        "self_attention.linear_qkv.weight",
        ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
        K.QKV,
        "qkv",
    ),
    Row(
        "self_attention.linear_proj.weight",
        "self_attention.linear_proj.weight",
        ("self_attn.o_proj.weight",),
        K.ROW,
        "o_proj",
    ),
)
MLA_ATTENTION = (
    Row("input_layernorm.weight", "input_layernorm.weight", ("input_layernorm.weight",), K.REPLICATED, "hidden"),
    Row(
        "self_attention.linear_kv_down_proj.weight",
        "self_attention.linear_kv_down_proj.weight",
        ("self_attn.kv_a_proj_with_mqa.weight",),
        K.MLA_DOWN,
        "kv_down",
    ),
    Row(
        "self_attention.kv_layernorm.weight",
        "self_attention.kv_layernorm.weight",
        ("self_attn.kv_a_layernorm.weight",),
        K.REPLICATED,
        "kv_rank",
    ),
    Row(
        "self_attention.linear_kv_up_proj.weight",
        "self_attention.linear_kv_up_proj.weight",
        ("self_attn.kv_b_proj.weight",),
        K.MLA_UP,
        "kv_up",
    ),
    Row(
        "self_attention.linear_proj.weight",
        "self_attention.linear_proj.weight",
        ("self_attn.o_proj.weight",),
        K.ROW,
        "o_proj",
    ),
)
MLA_Q_COMPRESSED = (
    Row(
        "self_attention.linear_q_down_proj.weight",
        "self_attention.linear_q_down_proj.weight",
        ("self_attn.q_a_proj.weight",),
        K.MLA_DOWN,
        "q_down",
    ),
    Row(
        "self_attention.q_layernorm.weight",
        "self_attention.q_layernorm.weight",
        ("self_attn.q_a_layernorm.weight",),
        K.REPLICATED,
        "q_rank",
    ),
    Row(
        "self_attention.linear_q_up_proj.weight",
        "self_attention.linear_q_up_proj.weight",
        ("self_attn.q_b_proj.weight",),
        K.MLA_UP,
        "q_up",
    ),
)
MLA_Q_DIRECT = (  # q_lora_rank null (DeepSeek-V2-Lite): one column-parallel query projection
    Row(
        "self_attention.linear_q_proj.weight",
        "self_attention.linear_q_proj.weight",
        ("self_attn.q_proj.weight",),
        K.MLA_UP,
        "q_proj",
    ),
)

# -- MLP, per layer: the pre-MLP norm is named after the attention spec (see the docstring) ------
GQA_PRE_MLP_NORM = Row(
    "mlp.linear_fc1.layer_norm_weight",
    "pre_mlp_layernorm.weight",
    ("post_attention_layernorm.weight",),
    K.REPLICATED,
    "hidden",
)
MLA_PRE_MLP_NORM = Row(
    "pre_mlp_layernorm.weight", "pre_mlp_layernorm.weight", ("post_attention_layernorm.weight",), K.REPLICATED, "hidden"
)
DENSE_MLP = (
    Row(
        "mlp.linear_fc1.weight",
        "mlp.linear_fc1.weight",
        ("mlp.gate_proj.weight", "mlp.up_proj.weight"),
        K.GATED_MLP,
        "fc1",
    ),
    Row("mlp.linear_fc2.weight", "mlp.linear_fc2.weight", ("mlp.down_proj.weight",), K.ROW, "fc2"),
)
DEEPSEEK_MOE = (
    Row("mlp.router.weight", "mlp.router.weight", ("mlp.gate.weight",), K.REPLICATED, "router"),
    Row(
        "mlp.shared_experts.linear_fc1.weight",
        "mlp.shared_experts.linear_fc1.weight",
        ("mlp.shared_experts.gate_proj.weight", "mlp.shared_experts.up_proj.weight"),
        K.GATED_MLP,
        "shared_fc1",
    ),
    Row(
        "mlp.shared_experts.linear_fc2.weight",
        "mlp.shared_experts.linear_fc2.weight",
        ("mlp.shared_experts.down_proj.weight",),
        K.ROW,
        "shared_fc2",
    ),
)
DEEPSEEK_ROUTER_BIAS = Row(
    "mlp.router.expert_bias", "mlp.router.expert_bias", ("mlp.gate.e_score_correction_bias",), K.REPLICATED, "experts"
)
DEEPSEEK_EXPERT = (
    Row(
        "mlp.experts.experts.linear_fc1.weight",
        "mlp.experts.local_experts.{i}.linear_fc1.weight",
        ("mlp.experts.{e}.gate_proj.weight", "mlp.experts.{e}.up_proj.weight"),
        K.GATED_MLP,
        "expert_fc1",
    ),
    Row(
        "mlp.experts.experts.linear_fc2.weight",
        "mlp.experts.local_experts.{i}.linear_fc2.weight",
        ("mlp.experts.{e}.down_proj.weight",),
        K.ROW,
        "expert_fc2",
    ),
)
MIXTRAL_MOE = (
    Row("mlp.router.weight", "mlp.router.weight", ("block_sparse_moe.gate.weight",), K.REPLICATED, "router"),
)
MIXTRAL_EXPERT = (
    Row(
        "mlp.experts.experts.linear_fc1.weight",
        "mlp.experts.local_experts.{i}.linear_fc1.weight",
        ("block_sparse_moe.experts.{e}.w1.weight", "block_sparse_moe.experts.{e}.w3.weight"),
        K.GATED_MLP,
        "expert_fc1",
    ),
    Row(
        "mlp.experts.experts.linear_fc2.weight",
        "mlp.experts.local_experts.{i}.linear_fc2.weight",
        ("block_sparse_moe.experts.{e}.w2.weight",),
        K.ROW,
        "expert_fc2",
    ),
)

HF_ARCHITECTURES = {
    "llama": ("LlamaForCausalLM", "llama"),
    "mixtral": ("MixtralForCausalLM", "mixtral"),
    "deepseek_v2": ("DeepseekV2ForCausalLM", "deepseek_v2"),
    "deepseek_v3": ("DeepseekV3ForCausalLM", "deepseek_v3"),
}
