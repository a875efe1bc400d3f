"""Rules of each training backend that the capability table (rules/capability.py) cannot express."""

from __future__ import annotations

from collections.abc import Iterator

from lmspec.compiler.errors import Problem, error, warning
from lmspec.compiler.rules.context import RuleContext


def offload_needs_zero_stage(ctx: RuleContext) -> Iterator[Problem]:
    """DeepSpeed offloads what ZeRO partitions: optimizer states from stage 1, parameters at stage 3.
    (Offload on Megatron is refused by capability.target_runs_spec.)"""
    s, p = ctx.spec, ctx.spec.parallel
    if s.train.backend != "deepspeed":
        return
    for key, needed in (("parallel.offload_optimizer", 1), ("parallel.offload_params", 3)):
        if ctx.value(key) and p.zero_stage < needed:
            yield error(key, f"{ctx.show(key)} needs parallel.zero_stage>={needed} ({ctx.show('parallel.zero_stage')})")


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


RULES = (offload_needs_zero_stage, megatron_sequence_parallel_hint)
