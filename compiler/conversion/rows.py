"""Conversion rows every family shares: Megatron checkpoint name -> running-model name -> HF name(s), kind.

Megatron names are megatron-core 0.16.1's, read from real models built with the local
layer spec (runtime/train/megatron/model.py) and from their dist_checkpointing metadata, not
guessed. Two name spaces differ: the running model's state_dict (what the reverse
conversion copies into) and the checkpoint (what `convert` reads). The GQA layer spec
saves its norms under Transformer Engine's names (`linear_qkv.layer_norm_weight`); the
MLA spec does not rename them. `{e}` is the global expert id, `{i}` the local one.
HF names are the released checkpoints' (transformers 5 fuses experts at load time).

The attention kind (GQA or MLA) picks megatron-core's modules, hence the rows here; a
family's module (lmspec.compiler.families) adds the rows of its own MoE block.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

from lmspec.compiler.conversion.kinds import SplitKind as Split

if TYPE_CHECKING:  # compiler/spec/sections/ takes its family names from the registry, which reads these rows
    from lmspec.compiler.spec.sections import ModelSpec


class Row(NamedTuple):
    checkpoint: str  # dist-checkpoint key suffix
    model: str  # running model state_dict key suffix
    hf: tuple[str, ...]  # HF name suffix(es)
    kind: Split
    shape: str  # key into the model's shape table (lmspec.compiler.conversion.mapping)


# -- whole-model tensors (every family) -----------------------------------------------------------
EMBEDDING = Row(
    "embedding.word_embeddings.weight",
    "embedding.word_embeddings.weight",
    ("model.embed_tokens.weight",),
    Split.COLUMN,
    "vocab",
)
FINAL_NORM = Row(
    "decoder.final_layernorm.weight",
    "decoder.final_layernorm.weight",
    ("model.norm.weight",),
    Split.REPLICATED,
    "hidden",
)
OUTPUT = Row("output_layer.weight", "output_layer.weight", ("lm_head.weight",), Split.COLUMN, "vocab")

# -- attention, per layer ----------------------------------------------------------------------
GQA_ATTENTION = (
    Row(
        "self_attention.linear_qkv.layer_norm_weight",
        "input_layernorm.weight",
        ("input_layernorm.weight",),
        Split.REPLICATED,
        "hidden",
    ),
    Row(
        "self_attention.linear_qkv.weight",
        "self_attention.linear_qkv.weight",
        ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
        Split.QKV,
        "qkv",
    ),
    Row(
        "self_attention.linear_proj.weight",
        "self_attention.linear_proj.weight",
        ("self_attn.o_proj.weight",),
        Split.ROW,
        "o_proj",
    ),
)
GQA_QKV_BIAS = Row(  # Qwen2: 1-D, interleaved by query group like the weight's rows
    "self_attention.linear_qkv.bias",
    "self_attention.linear_qkv.bias",
    ("self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"),
    Split.QKV,
    "qkv_bias",
)
GQA_QK_NORM = (  # Qwen3: one RMSNorm over head_dim shared by every query head, one by every key head
    Row(
        "self_attention.q_layernorm.weight",
        "self_attention.q_layernorm.weight",
        ("self_attn.q_norm.weight",),
        Split.REPLICATED,
        "head",
    ),
    Row(
        "self_attention.k_layernorm.weight",
        "self_attention.k_layernorm.weight",
        ("self_attn.k_norm.weight",),
        Split.REPLICATED,
        "head",
    ),
)
MLA_ATTENTION = (
    Row("input_layernorm.weight", "input_layernorm.weight", ("input_layernorm.weight",), Split.REPLICATED, "hidden"),
    Row(
        "self_attention.linear_kv_down_proj.weight",
        "self_attention.linear_kv_down_proj.weight",
        ("self_attn.kv_a_proj_with_mqa.weight",),
        Split.MLA_DOWN,
        "kv_down",
    ),
    Row(
        "self_attention.kv_layernorm.weight",
        "self_attention.kv_layernorm.weight",
        ("self_attn.kv_a_layernorm.weight",),
        Split.REPLICATED,
        "kv_rank",
    ),
    Row(
        "self_attention.linear_kv_up_proj.weight",
        "self_attention.linear_kv_up_proj.weight",
        ("self_attn.kv_b_proj.weight",),
        Split.MLA_UP,
        "kv_up",
    ),
    Row(
        "self_attention.linear_proj.weight",
        "self_attention.linear_proj.weight",
        ("self_attn.o_proj.weight",),
        Split.ROW,
        "o_proj",
    ),
)
MLA_Q_COMPRESSED = (
    Row(
        "self_attention.linear_q_down_proj.weight",
        "self_attention.linear_q_down_proj.weight",
        ("self_attn.q_a_proj.weight",),
        Split.MLA_DOWN,
        "q_down",
    ),
    Row(
        "self_attention.q_layernorm.weight",
        "self_attention.q_layernorm.weight",
        ("self_attn.q_a_layernorm.weight",),
        Split.REPLICATED,
        "q_rank",
    ),
    Row(
        "self_attention.linear_q_up_proj.weight",
        "self_attention.linear_q_up_proj.weight",
        ("self_attn.q_b_proj.weight",),
        Split.MLA_UP,
        "q_up",
    ),
)
MLA_Q_DIRECT = (  # q_lora_rank null (DeepSeek-V2-Lite): one column-parallel query projection
    Row(
        "self_attention.linear_q_proj.weight",
        "self_attention.linear_q_proj.weight",
        ("self_attn.q_proj.weight",),
        Split.MLA_UP,
        "q_proj",
    ),
)

# -- MLP, per layer: the pre-MLP norm is named after the attention spec (see the docstring) ------
GQA_PRE_MLP_NORM = Row(
    "mlp.linear_fc1.layer_norm_weight",
    "pre_mlp_layernorm.weight",
    ("post_attention_layernorm.weight",),
    Split.REPLICATED,
    "hidden",
)
MLA_PRE_MLP_NORM = Row(
    "pre_mlp_layernorm.weight",
    "pre_mlp_layernorm.weight",
    ("post_attention_layernorm.weight",),
    Split.REPLICATED,
    "hidden",
)
DENSE_MLP = (
    Row(
        "mlp.linear_fc1.weight",
        "mlp.linear_fc1.weight",
        ("mlp.gate_proj.weight", "mlp.up_proj.weight"),
        Split.GATED_MLP,
        "fc1",
    ),
    Row("mlp.linear_fc2.weight", "mlp.linear_fc2.weight", ("mlp.down_proj.weight",), Split.ROW, "fc2"),
)

# Routed experts as DeepSeek's and Qwen3-MoE's releases name them (Mixtral's are w1/w3/w2: its module).
PROJ_EXPERTS = (
    Row(
        "mlp.experts.experts.linear_fc1.weight",
        "mlp.experts.local_experts.{i}.linear_fc1.weight",
        ("mlp.experts.{e}.gate_proj.weight", "mlp.experts.{e}.up_proj.weight"),
        Split.GATED_MLP,
        "expert_fc1",
    ),
    Row(
        "mlp.experts.experts.linear_fc2.weight",
        "mlp.experts.local_experts.{i}.linear_fc2.weight",
        ("mlp.experts.{e}.down_proj.weight",),
        Split.ROW,
        "expert_fc2",
    ),
)


class MtpRows(NamedTuple):
    """A family's multi-token-prediction module beside its decoder layer: its own rows (checkpoint and
    model names under `mtp.layers.{i}.`), and the HF names of its copies of the embedding and output head."""

    own: tuple[Row, ...]
    embedding: str
    head: str


LayerRows = tuple[list[Row], list[Row]]
"""(rows of one layer, its per-expert rows: one row stands for every expert, named with {e} / {i})."""


def decoder_layer(m: ModelSpec, layer: int, moe: tuple[Sequence[Row], Sequence[Row]] | None) -> LayerRows:
    """The rows of decoder layer `layer`: attention by `model.attention` (with GQA's q/k/v bias and
    q/k norms where the model has them), then the dense MLP, or for
    an MoE layer the family's `moe` rows (router and shared experts, per-expert rows)."""
    mla = m.attention == "mla"
    rows = list(MLA_ATTENTION if mla else GQA_ATTENTION)
    if mla:
        assert m.mla is not None
        rows[1:1] = MLA_Q_COMPRESSED if m.mla.q_lora_rank is not None else MLA_Q_DIRECT
    else:
        rows[2:2] = [GQA_QKV_BIAS] * m.qkv_bias + list(GQA_QK_NORM) * m.qk_norm
    rows.append(MLA_PRE_MLP_NORM if mla else GQA_PRE_MLP_NORM)
    if moe is None or m.moe is None or layer < m.moe.first_dense_layers:
        return rows + list(DENSE_MLP), []
    routed, experts = moe
    return rows + list(routed), list(experts)
