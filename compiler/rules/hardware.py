"""Rule: the hardware says one thing about what the ranks run on.

Two keys say whether a job runs on CPU ranks: hardware.intra_node.link=shm (host shared memory between
processes) and hardware.gpu.generation=cpu. The compiler reads the first (models.dims.device_kind) and
the step-time model the second, so a spec where they disagree would be a GPU job to the launchers and
the capability table and a CPU to the cost model, or the other way round: it is refused, naming both.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import get_args, get_type_hints

from lmspec.compiler.errors import Problem, error
from lmspec.compiler.rules.context import RuleContext
from lmspec.compiler.spec.sections import GpuSpec, IntraNodeSpec

LINK, GENERATION = "hardware.intra_node.link", "hardware.gpu.generation"
CPU_LINK, CPU_GENERATION = "shm", "cpu"
GPU_LINKS = tuple(v for v in get_args(get_type_hints(IntraNodeSpec)["link"]) if v != CPU_LINK)
GPU_GENERATIONS = tuple(v for v in get_args(get_type_hints(GpuSpec)["generation"]) if v != CPU_GENERATION)


def _one_of(values: tuple[str, ...]) -> str:
    return f"{', '.join(values[:-1])} or {values[-1]}"


def link_matches_generation(ctx: RuleContext) -> Iterator[Problem]:
    hw = ctx.spec.hardware
    cpu_link, cpu_generation = hw.intra_node.link == CPU_LINK, hw.gpu.generation == CPU_GENERATION
    if cpu_link == cpu_generation:
        return
    if cpu_link:
        fix = f"set {GENERATION}={CPU_GENERATION} for CPU ranks, or {LINK}={_one_of(GPU_LINKS)} for GPUs"
    else:
        fix = f"set {LINK}={CPU_LINK} for CPU ranks, or {GENERATION}={_one_of(GPU_GENERATIONS)} for GPUs"
    yield error(
        LINK,
        f"{ctx.show(LINK)} and {ctx.show(GENERATION)} disagree on whether the ranks are CPU processes "
        f"({LINK}={CPU_LINK} goes with {GENERATION}={CPU_GENERATION}, and only with it); {fix}",
    )


RULES = (link_matches_generation,)
