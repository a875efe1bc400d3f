"""Rules of `train.moe`: what megatron-core asserts of its MoE training settings, said first with the keys.

megatron-core 0.16.1's TransformerConfig.__post_init__ and its token dispatchers raise on these; lmspec
refuses them before a build. Which targets run a setting at all is the capability table's
(compiler/capabilities.py: flex and the shared-expert overlap on GPUs, permutation fusion with Transformer
Engine, none of them with DeepSpeed). On a dense model every train.moe key does nothing: a warning each.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from lmspec.compiler.capabilities import FEATURE_KEYS
from lmspec.compiler.errors import Problem, error, warning
from lmspec.compiler.rules.context import TrainingContext

# each train.moe key's value that changes nothing (the capability table's ways out, and the rest)
NEUTRAL: dict[str, object] = {
    **{key: value for key, value in FEATURE_KEYS.values() if key.startswith("train.moe.")},
    "train.moe.flex_backend": None,
    "train.moe.drop_policy": "probs",
    "train.moe.pad_to_capacity": False,
    "train.moe.load_imbalance": None,
}


def dense_model_ignores_them(ctx: TrainingContext) -> Iterator[Problem]:
    if ctx.spec.model.moe is not None:
        return
    for key, neutral in NEUTRAL.items():
        if ctx.value(key) != neutral:
            yield warning(
                key,
                f"{ctx.show(key)} does nothing: {ctx.show('model.moe')} is a dense model; remove it",
            )


def flex_backend_goes_with_flex(ctx: TrainingContext) -> Iterator[Problem]:
    moe, p = ctx.spec.train.moe, ctx.spec.parallel
    if ctx.spec.model.moe is None:
        return
    if moe.dispatcher == "flex" and moe.flex_backend is None:
        yield error(
            "train.moe.flex_backend",
            f"{ctx.show('train.moe.dispatcher')} needs its kernels, but {ctx.show('train.moe.flex_backend')}: "
            "set train.moe.flex_backend=deepep (DeepEP) or hybridep (HybridEP, which also spans multi-node NVLink)",
        )
    if moe.dispatcher != "flex" and moe.flex_backend is not None:
        yield error(
            "train.moe.flex_backend",
            f"{ctx.show('train.moe.flex_backend')} does nothing with {ctx.show('train.moe.dispatcher')}: set "
            "train.moe.flex_backend=null, or train.moe.dispatcher=flex",
        )
    if moe.dispatcher == "flex" and p.tp * p.ep == 1:
        yield error(
            "train.moe.dispatcher",
            f"{ctx.show('train.moe.dispatcher')} dispatches over the TP x EP group (megatron-core asserts "
            f"TPxEP > 1), but {ctx.factor('parallel.tp')} x {ctx.factor('parallel.ep')} = 1: set parallel.ep=2 "
            "(or more, dividing the experts) or train.moe.dispatcher=alltoall",
        )
    if moe.dispatcher == "flex" and moe.flex_backend == "deepep" and moe.pad_to_capacity:
        yield error(
            "train.moe.pad_to_capacity",
            f"{ctx.show('train.moe.pad_to_capacity')}: megatron-core's flex dispatcher with "
            f"{ctx.show('train.moe.flex_backend')} does not pad to capacity; set train.moe.pad_to_capacity=false "
            "or train.moe.flex_backend=hybridep",
        )


def capacity_settings_need_a_capacity(ctx: TrainingContext) -> Iterator[Problem]:
    moe = ctx.spec.train.moe
    if ctx.spec.model.moe is None or moe.capacity_factor is not None:
        return
    capacity = ctx.show("train.moe.capacity_factor")
    if moe.pad_to_capacity:
        yield error(
            "train.moe.pad_to_capacity",
            f"{ctx.show('train.moe.pad_to_capacity')} pads each expert's tokens to its capacity, but {capacity} "
            "(dropless, no capacity; megatron-core raises): set train.moe.capacity_factor (e.g. 1.25) or "
            "train.moe.pad_to_capacity=false",
        )
    if moe.drop_policy != NEUTRAL["train.moe.drop_policy"]:
        yield error(
            "train.moe.drop_policy",
            f"{ctx.show('train.moe.drop_policy')} does nothing with {capacity} (dropless: no token is dropped): "
            "set train.moe.capacity_factor (e.g. 1.25) or train.moe.drop_policy=probs",
        )


# Conditions the search reads too (compiler/search/legality.py), plain arithmetic, true where legal: the
# all-to-all overlap (`moe_a2a`, a column of candidates) is searched, the job's MoE settings are not.
def overlaps_apart(moe_a2a: Any, shared_expert_overlap: bool) -> Any:
    """megatron-core refuses the shared-expert overlap beside the combined 1F1B's."""
    return (moe_a2a == 0) | (not shared_expert_overlap)


def a2a_overlap_has_an_all_to_all_to_hide(moe_a2a: Any, dispatcher: str) -> Any:
    """megatron-core overlaps the alltoall and flex dispatchers' all-to-alls, not the allgather's."""
    return (moe_a2a == 0) | (dispatcher != "allgather")


def shared_expert_overlap_has_its_layout(ctx: TrainingContext) -> Iterator[Problem]:
    m, moe = ctx.spec.model.moe, ctx.spec.train.moe
    if m is None or not moe.shared_expert_overlap:
        return
    key = "train.moe.shared_expert_overlap"
    asked = ctx.show(key)
    if m.num_shared_experts == 0:
        yield error(
            key, f"{asked} overlaps the shared experts, but {ctx.show('model.moe.num_shared_experts')}: set {key}=false"
        )
    if moe.dispatcher != "alltoall":
        yield error(
            key,
            f"{asked} runs the shared experts during the all-to-all dispatch (megatron-core: alltoall only), but "
            f"{ctx.show('train.moe.dispatcher')}: set train.moe.dispatcher=alltoall or {key}=false",
        )
    if not overlaps_apart(ctx.spec.parallel.overlap.moe_a2a, True):
        yield error(
            key,
            f"{asked} and {ctx.show('parallel.overlap.moe_a2a')} both schedule the shared experts (megatron-core "
            f"refuses the two together): set {key}=false or parallel.overlap.moe_a2a=false",
        )


def a2a_overlap_has_an_all_to_all(ctx: TrainingContext) -> Iterator[Problem]:
    """megatron-core overlaps the expert all-to-alls of the alltoall and flex dispatchers only."""
    if ctx.spec.model.moe is not None and not a2a_overlap_has_an_all_to_all_to_hide(
        ctx.spec.parallel.overlap.moe_a2a, ctx.spec.train.moe.dispatcher
    ):
        yield error(
            "train.moe.dispatcher",
            f"{ctx.show('parallel.overlap.moe_a2a')} overlaps the alltoall or flex dispatcher's all-to-alls, but "
            f"{ctx.show('train.moe.dispatcher')}: set train.moe.dispatcher=alltoall or parallel.overlap.moe_a2a=false",
        )


def unused_loss_settings(ctx: TrainingContext) -> Iterator[Problem]:
    """An aux-loss weight without an aux loss, a bias rate without the bias, a zero-weighted aux loss."""
    from lmspec.compiler.backends.megatron_config import load_balancing  # imports the families

    m, moe = ctx.spec.model.moe, ctx.spec.train.moe
    if m is None:
        return
    balancing = load_balancing(ctx.spec)
    if balancing == "none" and moe.aux_loss_coeff != NEUTRAL["train.moe.aux_loss_coeff"]:
        yield warning(
            "train.moe.aux_loss_coeff",
            f"{ctx.show('train.moe.aux_loss_coeff')} does nothing: {ctx.show('train.moe.load_balancing')} resolves to "
            "none (no aux loss); set train.moe.load_balancing=aux_loss (or seq_aux_loss, global_aux_loss)",
        )
    if balancing != "none" and moe.aux_loss_coeff == 0:
        yield warning(
            "train.moe.aux_loss_coeff",
            f"{ctx.show('train.moe.aux_loss_coeff')} weighs the {balancing} by 0: it balances nothing; set "
            "train.moe.load_balancing=none, or a weight (1e-3 .. 1e-2)",
        )
    if not m.router_score_bias and moe.bias_update_rate != NEUTRAL["train.moe.bias_update_rate"]:
        yield warning(
            "train.moe.bias_update_rate",
            f"{ctx.show('train.moe.bias_update_rate')} does nothing without the aux-loss-free expert bias "
            f"({ctx.show('model.moe.router_score_bias')})",
        )
    if moe.force_balance:
        yield warning(
            "train.moe.force_balance",
            f"{ctx.show('train.moe.force_balance')} routes tokens by random logits (megatron-core's benchmark mode): "
            "the step time is an evenly loaded run's and the loss no real training run's",
        )


RULES = (
    dense_model_ignores_them,
    flex_backend_goes_with_flex,
    capacity_settings_need_a_capacity,
    shared_expert_overlap_has_its_layout,
    a2a_overlap_has_an_all_to_all,
    unused_loss_settings,
)
