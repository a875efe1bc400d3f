"""Rules of what each training backend really supports."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from lmspec.compiler.errors import Problem, error, warning
from lmspec.compiler.rules.context import RuleContext


# Conditions of the rules below as plain arithmetic, true where legal: they take ints or numpy
# arrays alike, so `lmspec plan` drops exactly what these rules reject (compiler/search).
# `deepspeed` is 1 (True) for train.backend=deepspeed, 0 (False) for megatron.
def zero_matches_backend(deepspeed: Any, zero_stage: Any) -> Any:
    return (deepspeed != 0) | (zero_stage == 0)


def distributed_optimizer_matches_backend(deepspeed: Any, distributed_optimizer: Any) -> Any:
    return (deepspeed == 0) | (distributed_optimizer == 0)


def pipeline_zero_supported(deepspeed: Any, pp: Any, zero_stage: Any) -> Any:
    return (deepspeed == 0) | (pp == 1) | (zero_stage <= 1)


def data_parallel_only(deepspeed: Any, tp: Any, cp: Any, ep: Any) -> Any:
    return (deepspeed == 0) | ((tp == 1) & (cp == 1) & (ep == 1))


def zero_is_deepspeed(ctx: RuleContext) -> Iterator[Problem]:
    s = ctx.spec
    if not zero_matches_backend(s.train.backend == "deepspeed", s.parallel.zero_stage):
        yield error(
            "parallel.zero_stage",
            (
                f"{ctx.show('parallel.zero_stage')} is a DeepSpeed setting but {ctx.show('train.backend')}; "
                "set parallel.zero_stage=0 and parallel.distributed_optimizer=true (Megatron's ZeRO-1 equivalent), "
                "or train.backend=deepspeed"
            ),
        )


def distributed_optimizer_is_megatron(ctx: RuleContext) -> Iterator[Problem]:
    s = ctx.spec
    if not distributed_optimizer_matches_backend(s.train.backend == "deepspeed", s.parallel.distributed_optimizer):
        yield error(
            "parallel.distributed_optimizer",
            (
                f"{ctx.show('parallel.distributed_optimizer')} is a Megatron setting but {ctx.show('train.backend')}; "
                "use parallel.zero_stage=1 (or higher) instead"
            ),
        )


def offload_is_deepspeed_zero(ctx: RuleContext) -> Iterator[Problem]:
    s, p = ctx.spec, ctx.spec.parallel
    for key, needed in (("parallel.offload_optimizer", 1), ("parallel.offload_params", 3)):
        if not ctx.value(key):
            continue
        if s.train.backend != "deepspeed":
            yield error(
                key, f"{ctx.show(key)} needs train.backend=deepspeed ({ctx.show('train.backend')}); set {key}=false"
            )
        elif p.zero_stage < needed:
            yield error(key, f"{ctx.show(key)} needs parallel.zero_stage>={needed} ({ctx.show('parallel.zero_stage')})")


def deepspeed_pipeline_needs_low_zero(ctx: RuleContext) -> Iterator[Problem]:
    s = ctx.spec
    if not pipeline_zero_supported(s.train.backend == "deepspeed", s.parallel.pp, s.parallel.zero_stage):
        yield error(
            "parallel.pp",
            (
                f"{ctx.show('parallel.pp')} with {ctx.show('parallel.zero_stage')}: DeepSpeed's pipeline engine "
                "supports ZeRO stage 0 or 1 only; set parallel.zero_stage=1, or train.backend=megatron for PP"
            ),
        )


def deepspeed_is_data_parallel(ctx: RuleContext) -> Iterator[Problem]:
    """lmspec's deepspeed backend trains a HuggingFace model under ZeRO data parallelism."""
    s, p = ctx.spec, ctx.spec.parallel
    if data_parallel_only(s.train.backend == "deepspeed", p.tp, p.cp, p.ep):
        return
    for key in ("parallel.tp", "parallel.cp", "parallel.ep"):
        if ctx.value(key) > 1:
            yield error(
                key,
                (
                    f"{ctx.show(key)} with {ctx.show('train.backend')}: lmspec's DeepSpeed trainer is ZeRO data "
                    f"parallel only; set {key}=1 (shard with parallel.zero_stage), or train.backend=megatron"
                ),
            )


def megatron_sequence_parallel_hint(ctx: RuleContext) -> Iterator[Problem]:
    s = ctx.spec
    dense = s.model.moe is None  # MoE under TP needs it outright (experts.moe_tensor_parallel_needs_...)
    if s.train.backend == "megatron" and dense and s.parallel.tp > 1 and not s.parallel.sequence_parallel:
        yield warning(
            "parallel.sequence_parallel",
            (
                f"{ctx.show('parallel.sequence_parallel')} with {ctx.show('parallel.tp')}: activations of norms and "
                "dropout are replicated on every TP rank; parallel.sequence_parallel=true divides them by tp"
            ),
        )


RULES = (
    zero_is_deepspeed,
    distributed_optimizer_is_megatron,
    offload_is_deepspeed_zero,
    deepspeed_pipeline_needs_low_zero,
    deepspeed_is_data_parallel,
    megatron_sequence_parallel_hint,
)
