"""Rules of the architecture itself: attention shapes, MoE block, context length."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import fields

from lmspec.compiler.errors import Problem, error
from lmspec.compiler.families import FAMILIES
from lmspec.compiler.models.dims import divisors
from lmspec.compiler.rules.context import RuleContext, TrainingContext, listed
from lmspec.compiler.spec.sections import ROPE_SCALING_FIELDS, RopeScalingSpec


def attention_block_matches_kind(ctx: RuleContext) -> Iterator[Problem]:
    m = ctx.spec.model
    if m.attention == "mla" and m.mla is None:
        yield error(
            "model.mla",
            f"{ctx.show('model.attention')} needs the model.mla block (kv_lora_rank, ...); {ctx.show('model.mla')}",
        )
    if m.attention == "gqa" and m.mla is not None:
        yield error(
            "model.mla",
            f"{ctx.show('model.mla')} is set but {ctx.show('model.attention')}; "
            "set model.mla=null or model.attention=mla",
        )


def gqa_groups_even(ctx: RuleContext) -> Iterator[Problem]:
    m = ctx.spec.model
    if m.attention == "gqa" and (m.num_kv_heads > m.num_attention_heads or m.num_attention_heads % m.num_kv_heads):
        valid = [d for d in divisors(m.num_attention_heads)]
        yield error(
            "model.num_kv_heads",
            (
                f"{ctx.show('model.num_kv_heads')} must divide {ctx.show('model.num_attention_heads')}; "
                f"valid: {listed(valid)}"
            ),
        )


def mla_head_dims_consistent(ctx: RuleContext) -> Iterator[Problem]:
    m = ctx.spec.model
    if m.attention != "mla" or m.mla is None:
        return
    qk = m.mla.qk_nope_head_dim + m.mla.qk_rope_head_dim
    if m.head_dim != qk:
        yield error(
            "model.head_dim",
            (
                f"{ctx.show('model.head_dim')} must equal model.mla.qk_nope_head_dim + qk_rope_head_dim "
                f"= {m.mla.qk_nope_head_dim} + {m.mla.qk_rope_head_dim} = {qk} for MLA; set model.head_dim={qk}"
            ),
        )
    if m.num_kv_heads != m.num_attention_heads:
        yield error(
            "model.num_kv_heads",
            (
                f"{ctx.show('model.num_kv_heads')} must equal {ctx.show('model.num_attention_heads')} for MLA "
                f"(keys and values are decompressed per head); set model.num_kv_heads={m.num_attention_heads}"
            ),
        )


def moe_block_consistent(ctx: RuleContext) -> Iterator[Problem]:
    moe, layers = ctx.spec.model.moe, ctx.spec.model.num_layers
    if moe is None:
        return
    if moe.top_k > moe.num_experts:
        yield error("model.moe.top_k", f"{ctx.show('model.moe.top_k')} exceeds {ctx.show('model.moe.num_experts')}")
    if moe.first_dense_layers >= layers:
        yield error(
            "model.moe.first_dense_layers",
            (
                f"{ctx.show('model.moe.first_dense_layers')} leaves no MoE layer of {ctx.show('model.num_layers')}; "
                f"use at most {layers - 1}, or model.moe=null for a dense model"
            ),
        )


def seq_length_within_positions(ctx: TrainingContext) -> Iterator[Problem]:
    if ctx.spec.train.seq_length > ctx.spec.model.max_position_embeddings:
        yield error(
            "train.seq_length",
            (
                f"{ctx.show('train.seq_length')} exceeds {ctx.show('model.max_position_embeddings')}; "
                f"use train.seq_length<={ctx.spec.model.max_position_embeddings} (or extend RoPE first)"
            ),
        )


def mtp_only_where_released(ctx: RuleContext) -> Iterator[Problem]:
    """A multi-token-prediction module converts only to an architecture whose checkpoints name one."""
    m = ctx.spec.model
    if m.mtp_layers and FAMILIES[m.family].mtp_rows() is None:
        with_mtp = [name for name, family in FAMILIES.items() if family.mtp_rows() is not None]
        yield error(
            "model.mtp_layers",
            (
                f"{ctx.show('model.mtp_layers')}: {ctx.show('model.family')} has no multi-token-prediction "
                f"layers in its HF checkpoints (only {listed(with_mtp)} do); set model.mtp_layers=0"
            ),
        )


def rope_scaling_fields_match_type(ctx: RuleContext) -> Iterator[Problem]:
    rs = ctx.spec.model.rope_scaling
    if rs is None:
        return
    wanted = ROPE_SCALING_FIELDS[rs.type]
    for name in (f.name for f in fields(RopeScalingSpec) if f.name not in ("type", "factor")):
        path = f"model.rope_scaling.{name}"
        value = getattr(rs, name)
        if name in wanted and value is None:
            yield error(path, f"{ctx.show(path)}: rope_scaling type {rs.type} needs it; set it from the config.json")
        elif name not in wanted and value is not None:
            yield error(path, f"{ctx.show(path)}: rope_scaling type {rs.type} does not use it; set {path}=null")


def model_keys_fit_family(ctx: RuleContext) -> Iterator[Problem]:
    """A key the family's HF class hard-codes (Qwen2 always biases q/k/v, Llama never normalises q/k)
    must hold that value: another one could be trained but neither converted nor served as that class."""
    m = ctx.spec.model
    family = FAMILIES[m.family]
    for key, value in family.fixed:
        if getattr(m, key) != value:
            path = f"model.{key}"
            yield error(
                path,
                (
                    f"{ctx.show(path)}: {family.hf_class} ({ctx.show('model.family')}) always has "
                    f"{key}={str(value).lower()}; set {path}={str(value).lower()} or pick the family that has it"
                ),
            )
    derived = m.hidden_size // m.num_attention_heads
    if family.head_dim_derived and m.head_dim * m.num_attention_heads != m.hidden_size:
        yield error(
            "model.head_dim",
            (
                f"{ctx.show('model.head_dim')}: {family.hf_class} ({ctx.show('model.family')}) serves with head_dim "
                f"= model.hidden_size / model.num_attention_heads; set model.head_dim={derived} or use family qwen3"
            ),
        )


def router_groups_consistent(ctx: RuleContext) -> Iterator[Problem]:
    """Group-limited routing (DeepSeek-V3): experts split into equal groups, each token routed into the
    best `router_group_topk` groups, its top_k experts taken from those."""
    moe = ctx.spec.model.moe
    if moe is None:
        return
    groups, top = moe.router_num_groups, moe.router_group_topk
    if (groups is None) != (top is None):
        yield error(
            "model.moe.router_group_topk",
            (
                f"{ctx.show('model.moe.router_num_groups')} and {ctx.show('model.moe.router_group_topk')} "
                "are set together or both null"
            ),
        )
        return
    if groups is None or top is None:
        return
    if moe.num_experts % groups:
        valid = divisors(moe.num_experts)
        yield error(
            "model.moe.router_num_groups",
            f"{ctx.show('model.moe.router_num_groups')} must divide {ctx.show('model.moe.num_experts')}; valid: "
            f"{listed(valid)}",
        )
    elif top > groups:
        yield error(
            "model.moe.router_group_topk",
            f"{ctx.show('model.moe.router_group_topk')} exceeds {ctx.show('model.moe.router_num_groups')}",
        )
    elif moe.top_k > top * (moe.num_experts // groups):
        yield error(
            "model.moe.top_k",
            (
                f"{ctx.show('model.moe.top_k')} exceeds the experts of the {top} groups a token may use "
                f"({top} x {moe.num_experts // groups}); raise model.moe.router_group_topk"
            ),
        )


def family_carries_the_model(ctx: RuleContext) -> Iterator[Problem]:
    """Every model value is one the family's HF class computes (lmspec.compiler.families.family.Family.refusals)."""
    m = ctx.spec.model
    for path, why in FAMILIES[m.family].refusals(m):
        yield error(path, f"{ctx.show(path)} under {ctx.show('model.family')}: {why}")


def family_trains_the_model(ctx: TrainingContext) -> Iterator[Problem]:
    """Every model value megatron-core trains as the family's HF class computes it
    (lmspec.compiler.families.family.Family.training_refusals): a training rule, since a serve-only job
    serves the released checkpoint and megatron-core never sees it (Kimi-K2's, say)."""
    m = ctx.spec.model
    for path, why in FAMILIES[m.family].training_refusals(m):
        yield error(path, f"{ctx.show(path)} under {ctx.show('model.family')}: {why}")


RULES = (
    attention_block_matches_kind,
    rope_scaling_fields_match_type,
    model_keys_fit_family,
    router_groups_consistent,
    gqa_groups_even,
    mla_head_dims_consistent,
    moe_block_consistent,
    mtp_only_where_released,
    family_carries_the_model,
)
TRAINING_RULES = (seq_length_within_positions, family_trains_the_model)
