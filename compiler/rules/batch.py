"""Rules of the batch: the global batch splits into whole micro-batches on every DP rank."""

from __future__ import annotations

from collections.abc import Iterator

from compiler.errors import Problem, error
from compiler.layout import data_parallel_size
from compiler.rules.context import RuleContext


def global_batch_divides(ctx: RuleContext) -> Iterator[Problem]:
    t = ctx.spec.train
    dp = data_parallel_size(ctx.spec)
    if dp is None:
        return
    per_step = t.micro_batch_size * dp
    if t.global_batch_size % per_step:
        lower = t.global_batch_size // per_step * per_step
        upper = lower + per_step
        yield error("train.global_batch_size", (
            f"{ctx.show('train.global_batch_size')} is not a multiple of {ctx.factor('train.micro_batch_size')} "
            f"x dp({dp}) = {per_step}; use {', '.join(str(v) for v in (lower, upper) if v > 0)}"))


RULES = (global_batch_divides,)
