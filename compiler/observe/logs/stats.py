"""Warm-up skip and the summary statistics of a metric over steps."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from lmspec.compiler.observe.metrics_record import StepMetrics

DEFAULT_WARMUP_STEPS = 10  # compile, allocator growth, first data loads: not steady state


@dataclass(frozen=True)
class Summary:
    count: int
    mean: float
    p50: float
    p90: float
    minimum: float
    maximum: float


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), q in [0, 100]."""
    if not sorted_values:
        raise ValueError("percentile of no values")
    position = (len(sorted_values) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (position - low)


def summarize(values: Sequence[float]) -> Summary | None:
    finite = sorted(v for v in values if math.isfinite(v))
    if not finite:
        return None
    return Summary(
        count=len(finite),
        mean=sum(finite) / len(finite),
        p50=percentile(finite, 50),
        p90=percentile(finite, 90),
        minimum=finite[0],
        maximum=finite[-1],
    )


def skips_warmup(largest_step: int | None, warmup_steps: int) -> bool:
    """Whether steps <= warmup_steps are left out: not when that would leave no step."""
    return largest_step is None or largest_step > warmup_steps


def steady_steps(steps: Sequence[StepMetrics], warmup_steps: int) -> tuple[list[StepMetrics], bool]:
    """Steps after the first `warmup_steps`; all steps (and False) when none would remain."""
    if skips_warmup(max((s.step for s in steps), default=None), warmup_steps):
        return [s for s in steps if s.step > warmup_steps], True
    return list(steps), False
