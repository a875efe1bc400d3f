"""Derived layout numbers that both the rules and the Plan need: dp, layers per stage."""

from __future__ import annotations

from lmspec.compiler.spec.sections import Spec


def world_size(spec: Spec) -> int:
    return spec.hardware.gpus_per_node * spec.hardware.nodes


def model_parallel_size(spec: Spec) -> int:
    p = spec.parallel
    return p.tp * p.pp * p.cp


def data_parallel_size(spec: Spec) -> int | None:
    """dp as given, or world / (tp x pp x cp) for `auto`; None when that does not divide."""
    if spec.parallel.dp != "auto":
        return int(spec.parallel.dp)
    world, mp = world_size(spec), model_parallel_size(spec)
    return world // mp if world % mp == 0 else None


def balanced_stages(num_layers: int, pp: int) -> tuple[int, ...]:
    """Split layers over stages as evenly as possible; the first and last stages, which also
    hold the embedding and the output head, are the ones that get a layer fewer."""
    per_stage = -(-num_layers // pp)
    stages = [per_stage] * pp
    # stages from both ends inwards (0, pp-1, 1, pp-2, ...): dict.fromkeys keeps the first of each, in O(pp)
    order = dict.fromkeys(i for pair in zip(range(pp), reversed(range(pp))) for i in pair)
    for i in list(order)[: per_stage * pp - num_layers]:
        stages[i] -= 1
    return tuple(stages)


def stage_layers(spec: Spec) -> tuple[int, ...] | None:
    """Layers on each pipeline stage, or None when the layout is not legal."""
    layers, pp, layout = spec.model.num_layers, spec.parallel.pp, spec.parallel.pp_layout
    if layout is None:
        return (layers // pp,) * pp if layers % pp == 0 else None
    if layout == "auto":
        return balanced_stages(layers, pp) if layers >= pp else None
    stages = tuple(int(n) for n in layout)
    return stages if len(stages) == pp and sum(stages) == layers and min(stages) >= 1 else None


def divisors(n: int) -> list[int]:
    """Every divisor of n, ascending, found in O(sqrt n) steps."""
    small: list[int] = []
    large: list[int] = []
    d = 1
    while d * d <= n:
        if n % d == 0:
            small.append(d)
            if d != n // d:
                large.append(n // d)
        d += 1
    return small + large[::-1]


def next_multiple_above(n: int, step: int) -> int:
    """The smallest multiple of `step` greater than n."""
    return (n // step + 1) * step
