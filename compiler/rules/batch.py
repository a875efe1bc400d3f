"""Rules of the batch: the global batch splits into whole micro-batches on every DP rank."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from lmspec.compiler.errors import Problem, error
from lmspec.compiler.models.dims import data_parallel_size
from lmspec.compiler.rules.context import TrainingContext


# Conditions of the rules below as plain arithmetic, true where legal: they take ints or numpy
# arrays alike, so `lmspec plan` drops exactly what these rules reject (compiler/search).
def global_batch_splits(global_batch_size: Any, micro_batch_size: Any, dp: Any) -> Any:
    return global_batch_size % (micro_batch_size * dp) == 0


def global_batch_divides(ctx: TrainingContext) -> Iterator[Problem]:
    t = ctx.spec.train
    dp = data_parallel_size(ctx.spec)
    if dp is None:
        return
    per_step = t.micro_batch_size * dp
    if not global_batch_splits(t.global_batch_size, t.micro_batch_size, dp):
        lower = t.global_batch_size // per_step * per_step
        upper = lower + per_step
        yield error(
            "train.global_batch_size",
            (
                f"{ctx.show('train.global_batch_size')} is not a multiple of {ctx.factor('train.micro_batch_size')} "
                f"x dp({dp}) = {per_step}; use {', '.join(str(v) for v in (lower, upper) if v > 0)}"
            ),
        )


RULES = (global_batch_divides,)
