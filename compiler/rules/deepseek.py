"""What DeepSeek-V2/V3's converted checkpoints can carry: transformers' DeepseekV2/V3 classes and vLLM's
deepseek_v2.py each hard-code part of the router and the rope, and megatron-core trains the spec as
written; a value one of them would compute differently is refused here, not served wrong."""

from __future__ import annotations

from collections.abc import Iterator

from lmspec.compiler.errors import Problem, error
from lmspec.compiler.rules.context import RuleContext

# The router each HF class computes: V2 scores with a softmax (no correction bias), V3 with a sigmoid plus
# its e_score_correction_bias buffer (topk_method noaux_tc, which vLLM loads as a weight).
CLASS_ROUTER = {"deepseek_v2": ("softmax", False), "deepseek_v3": ("sigmoid", True)}
# How many of a group's best scores sum to the group's score: transformers and vLLM take V2's maximum
# (group_limited_greedy) and V3's top-2 sum; megatron-core sums the top (top_k / router_group_topk).
CLASS_GROUP_SCORE_TOP = {"deepseek_v2": 1, "deepseek_v3": 2}


def router_as_the_class_computes(ctx: RuleContext) -> Iterator[Problem]:
    m = ctx.spec.model
    if m.family not in CLASS_ROUTER or m.moe is None:
        return
    moe, (score, bias) = m.moe, CLASS_ROUTER[m.family]
    if moe.router_score_function != score:
        yield error(
            "model.moe.router_score_function",
            f"{ctx.show('model.moe.router_score_function')}: transformers' and vLLM's {m.family} score experts "
            f"with {score}; set model.moe.router_score_function={score}",
        )
    if moe.router_score_bias != bias:
        yield error(
            "model.moe.router_score_bias",
            f"{ctx.show('model.moe.router_score_bias')}: {m.family}'s HF class "
            f"{'always carries' if bias else 'has no'} a score-correction bias (e_score_correction_bias); "
            f"set model.moe.router_score_bias={str(bias).lower()}",
        )
    if m.family == "deepseek_v2" and moe.norm_topk_prob:
        yield error(
            "model.moe.norm_topk_prob",
            f"{ctx.show('model.moe.norm_topk_prob')}: transformers' DeepseekV2 ignores norm_topk_prob (it never "
            "renormalises the top-k weights) while megatron-core and vLLM would; set model.moe.norm_topk_prob=false",
        )
    if score == "sigmoid" and not moe.norm_topk_prob and moe.top_k > 1:
        yield error(
            "model.moe.norm_topk_prob",
            f"{ctx.show('model.moe.norm_topk_prob')}: megatron-core always renormalises sigmoid top-k weights "
            "(top_k > 1); set model.moe.norm_topk_prob=true",
        )
    top = moe.router_group_topk
    per_group = CLASS_GROUP_SCORE_TOP[m.family]
    if top is not None and moe.top_k != per_group * top:
        yield error(
            "model.moe.router_group_topk",
            (
                f"{ctx.show('model.moe.router_group_topk')} with {ctx.show('model.moe.top_k')}: megatron-core "
                f"scores a group by its top {moe.top_k // top} experts, transformers' and vLLM's {m.family} by "
                f"its top {per_group}; set model.moe.top_k={per_group * top} or "
                f"model.moe.router_group_topk={max(moe.top_k // per_group, 1)}"
            ),
        )


def rope_as_mla_computes(ctx: RuleContext) -> Iterator[Problem]:
    """megatron-core's MLA has plain rope and YaRN only."""
    m = ctx.spec.model
    rs = m.rope_scaling
    if m.attention != "mla" or rs is None:
        return
    if rs.type != "yarn":
        yield error(
            "model.rope_scaling.type",
            f"{ctx.show('model.rope_scaling.type')}: megatron-core's multi-latent attention scales rope only "
            "with yarn; set model.rope_scaling.type=yarn with its fields, or model.rope_scaling=null",
        )
    elif not (rs.mscale and rs.mscale_all_dim) and (rs.mscale != 1.0 or rs.mscale_all_dim):
        yield error(
            "model.rope_scaling.mscale",
            f"{ctx.show('model.rope_scaling.mscale')} with {ctx.show('model.rope_scaling.mscale_all_dim')}: "
            "transformers reads the two only when both are non-zero (else it scales cos/sin as mscale=1.0), "
            "megatron-core and vLLM always; set both non-zero, or mscale=1.0 and mscale_all_dim=0.0",
        )


RULES = (router_as_the_class_computes, rope_as_mla_computes)
