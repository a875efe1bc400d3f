"""Rules of expert parallelism (Megatron's MoE parallel folding)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from lmspec.compiler.backends import backend_of
from lmspec.compiler.errors import Problem, error
from lmspec.compiler.models.dims import data_parallel_size, divisors, ranks_per_stage
from lmspec.compiler.rules.context import TrainingContext, listed


# Conditions of the rules below as plain arithmetic, true where legal: they take ints or numpy
# arrays alike, so `lmspec plan` drops exactly what these rules reject (compiler/search).
def expert_parallel_has_moe(is_moe: Any, ep: Any, etp: Any) -> Any:
    return (is_moe != 0) | ((ep == 1) & (etp == 1))


def ep_divides_experts(num_experts: Any, ep: Any) -> Any:
    return num_experts % ep == 0


def expert_group_fits(ranks_per_stage: Any, ep: Any, etp: Any) -> Any:
    return ranks_per_stage % (ep * etp) == 0


def moe_tp_has_sequence_parallel(needs_it: Any, is_moe: Any, tp: Any, sequence_parallel: Any) -> Any:
    """`needs_it`: the backend's TrainingBackend.moe_tp_needs_sequence_parallel (a column, in the search)."""
    return (needs_it == 0) | (is_moe == 0) | (tp == 1) | (sequence_parallel != 0)


def ep_needs_moe(ctx: TrainingContext) -> Iterator[Problem]:
    p = ctx.spec.parallel
    if not expert_parallel_has_moe(ctx.spec.model.moe is not None, p.ep, p.etp):
        key = "parallel.ep" if p.ep > 1 else "parallel.etp"
        yield error(key, f"{ctx.show(key)} needs a MoE model, but {ctx.show('model.moe')}; set {key}=1")


def experts_divide_by_ep(ctx: TrainingContext) -> Iterator[Problem]:
    moe, ep = ctx.spec.model.moe, ctx.spec.parallel.ep
    if moe is not None and not ep_divides_experts(moe.num_experts, ep):
        yield error(
            "parallel.ep",
            (
                f"{ctx.show('parallel.ep')} does not divide {ctx.show('model.moe.num_experts')}; "
                f"valid: {listed(divisors(moe.num_experts))}"
            ),
        )


def expert_group_fits_ranks(ctx: TrainingContext) -> Iterator[Problem]:
    """Megatron folds EP x ETP over the dense layers' DP x TP x CP ranks of one stage."""
    p = ctx.spec.parallel
    dp = data_parallel_size(ctx.spec)
    if ctx.spec.model.moe is None or dp is None:
        return
    ranks = ranks_per_stage(dp, p.tp, p.cp)
    if not expert_group_fits(ranks, p.ep, p.etp):
        valid = [e for e in divisors(ranks) if e % p.etp == 0 and ctx.spec.model.moe.num_experts % (e // p.etp) == 0]
        yield error(
            "parallel.ep",
            (
                f"{ctx.factor('parallel.ep')} x {ctx.factor('parallel.etp')} = {p.ep * p.etp} does not divide "
                f"dp({dp}) x {ctx.factor('parallel.tp')} x "
                f"{ctx.factor('parallel.cp')} = {ranks} ranks per pipeline stage "
                f"(parallel.ep from {ctx.origins.of('parallel.ep')}); "
                f"ep x etp must be one of {listed(valid)}"
            ),
        )


def moe_tensor_parallel_needs_sequence_parallel(ctx: TrainingContext) -> Iterator[Problem]:
    """megatron-core raises at model build for MoE layers under TP without sequence parallelism."""
    s = ctx.spec
    if not moe_tp_has_sequence_parallel(
        backend_of(s).moe_tp_needs_sequence_parallel,
        s.model.moe is not None,
        s.parallel.tp,
        s.parallel.sequence_parallel,
    ):
        yield error(
            "parallel.sequence_parallel",
            (
                f"{ctx.show('parallel.sequence_parallel')} with {ctx.show('parallel.tp')} and MoE layers: "
                "megatron-core dispatches tokens to experts from sequence-parallel shards and refuses tensor "
                "parallelism without it; set parallel.sequence_parallel=true"
            ),
        )


RULES = (ep_needs_moe, experts_divide_by_ep, expert_group_fits_ranks, moe_tensor_parallel_needs_sequence_parallel)
