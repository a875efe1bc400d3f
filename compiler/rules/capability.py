"""Rules of what the spec's training target runs, built from the one capability table.

Every refusal names the key that asks for the feature, why the target lacks it, the targets on
the same device that run it (the keys to change) and the key's value that does without it.
`lmspec plan` drops exactly what `target_runs_spec` refuses: it calls `runs_spec` (compiler/search).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any, NamedTuple, get_args, get_type_hints

from lmspec.compiler.capabilities import (
    FEATURE_KEYS,
    NO_TARGET,
    Capabilities,
    Feature,
    Target,
    capabilities_of,
    recipe_refusal,
    recipes_running,
    requested_features,
    target_of,
    targets_running,
)
from lmspec.compiler.errors import Problem, error
from lmspec.compiler.models.dims import Device
from lmspec.compiler.models.recipes import RECIPES
from lmspec.compiler.rules.context import TrainingContext
from lmspec.compiler.spec.override_text import override_value
from lmspec.compiler.spec.sections import GpuSpec, TrainingSpec

# The keys that pick a target, as `Target`'s fields name them.
TARGET_KEYS = (("backend", "train.backend"), ("impl", "train.transformer_impl"))


def runs_spec(spec: TrainingSpec) -> bool:
    """True where the spec's target exists and runs every feature the spec asks for."""
    caps = capabilities_of(spec)
    return caps is not None and all(caps.runs(f) for f in requested_features(spec))


def with_value(section: Any, key: str, value: Any) -> Any:
    """The spec (or a section) with one dotted key replaced (sections are frozen dataclasses)."""
    head, _, rest = key.partition(".")
    inner = with_value(getattr(section, head), rest, value) if rest else value
    return dataclasses.replace(section, **{head: inner})


def without(spec: TrainingSpec, feature: Feature, caps: Capabilities) -> Any:
    """The value of the feature's key that the target runs: FEATURE_KEYS' value, followed down while
    that value asks for another feature the target lacks (parallel.zero_stage 3 -> 2 -> 1 -> 0)."""
    key, value = FEATURE_KEYS[feature]
    while True:
        lacking = [f for f in requested_features(with_value(spec, key, value)) if FEATURE_KEYS[f][0] == key]
        if not lacking or caps.runs(lacking[0]):
            return value
        value = FEATURE_KEYS[lacking[0]][1]


def _changes(own: Target, other: Target) -> list[str]:
    return [
        f"{key}={getattr(other, field)}" for field, key in TARGET_KEYS if getattr(own, field) != getattr(other, field)
    ]


def ways_in(own: Target, feature: Feature, device: Device) -> list[str]:
    """The fewest key changes that reach a target on `device` running `feature`."""
    options = [_changes(own, t) for t in targets_running(feature, device)]
    if not options:
        return []
    fewest = min(len(o) for o in options)
    return [" and ".join(o) for o in options if len(o) == fewest]


def way_in(own: Target, feature: Feature) -> str:
    """`needs train.backend=megatron`, or GPU hardware (with the keys there) where no target on the
    spec's device runs the feature."""
    here = ways_in(own, feature, own.device)
    if here:
        return f"needs {' or '.join(here)}"
    if own.device == "gpu":
        return "runs on no target"
    there = ways_in(own, feature, "gpu")
    return "needs GPU hardware" + (f" with {' or '.join(there)}" if any(there) else "") + " (no CPU target runs it)"


def target_runs_spec(ctx: TrainingContext) -> Iterator[Problem]:
    """One error per feature the target lacks; one error on train.transformer_impl for no target."""
    spec = ctx.spec
    own = target_of(spec)
    caps = capabilities_of(spec)
    if caps is None:
        yield error(
            "train.transformer_impl",
            (
                f"{ctx.show('train.transformer_impl')} with {ctx.show('train.backend')} on {own.device}: "
                f"{NO_TARGET[(own.backend, own.impl)]}"
            ),
        )
        return
    for feature in requested_features(spec):
        if caps.runs(feature):
            continue
        key = FEATURE_KEYS[feature][0]
        yield error(
            key,
            (
                f"{ctx.show(key)} {way_in(own, feature)}; {caps.lacks[feature]}; "
                f"or set {key}={override_value(without(spec, feature, caps))}"
            ),
        )


class LowPrecision(NamedTuple):
    """What one low train.precision is asked and checked by."""

    recipe_key: str  # the key naming its recipe
    feature: Feature  # the capability a target needs to run it
    peak: str  # the GpuSpec field that says the part has its tensor cores
    who: str  # which parts do, for the message


LOW_PRECISION = {
    "fp8": LowPrecision("train.fp8_recipe", "precision_fp8", "fp8_tflops", "Hopper and Ada do"),
    "fp4": LowPrecision("train.fp4_recipe", "precision_fp4", "fp4_tflops", "Blackwell does"),
}


def _has_cores(ctx: TrainingContext) -> LowPrecision | None:
    """The spec's low precision where its target runs it (one that does not is refused by target_runs_spec,
    once); None for 16/32-bit jobs."""
    low = LOW_PRECISION.get(ctx.spec.train.precision)
    caps = capabilities_of(ctx.spec)
    return low if low is not None and caps is not None and caps.runs(low.feature) else None


def low_precision_has_tensor_cores(ctx: TrainingContext) -> Iterator[Problem]:
    """FP8 needs hardware.gpu.fp8_tflops, FP4 fp4_tflops: a part without them has no such tensor cores."""
    t, gpu = ctx.spec.train, ctx.spec.hardware.gpu
    low = _has_cores(ctx)
    if low is not None and getattr(gpu, low.peak) is None:
        yield error(
            "train.precision",
            (
                f"{ctx.show('train.precision')} needs {t.precision.upper()} tensor cores, but "
                f"{ctx.show(f'hardware.gpu.{low.peak}')} ({gpu.name} has none; {low.who}); set train.precision=bf16"
            ),
        )


def recipe_runs_on_generation(ctx: TrainingContext) -> Iterator[Problem]:
    """Each recipe runs on the generations of its row in compiler/models/recipes.py, with the Transformer
    Engine release that row names; checked where the part has the precision's tensor cores at all
    (low_precision_has_tensor_cores refuses one without them)."""
    t, gpu = ctx.spec.train, ctx.spec.hardware.gpu
    low, refused = _has_cores(ctx), recipe_refusal(ctx.spec)
    if low is None or refused is None or getattr(gpu, low.peak) is None:
        return
    recipe, why = refused
    generations = ", ".join(g for g in get_args(get_type_hints(GpuSpec)["generation"]) if recipe.runs_on(g))
    others = recipes_running(t.precision, gpu.generation)
    way_out = f"set {recipe.key}={' or '.join(others)}, or " if others else "set "
    yield error(
        recipe.key,
        (
            f"{ctx.show(recipe.key)} does not run on {ctx.show('hardware.gpu.generation')}: {why}; it runs on "
            f"{generations} with Transformer Engine >= {recipe.te_version} ({recipe.te_source}); "
            f"{way_out}train.precision=bf16 and {recipe.key}=null"
        ),
    )


def recipe_matches_precision(ctx: TrainingContext) -> Iterator[Problem]:
    """A recipe without its precision would do nothing; FP8 or FP4 without a recipe leaves the scaling unsaid."""
    t = ctx.spec.train
    for precision, low in LOW_PRECISION.items():
        key = low.recipe_key
        if t.precision == precision and ctx.value(key) is None:
            names = ", ".join(f"{n} ({r.summary})" for n, r in RECIPES.items() if r.precision == precision)
            yield error(
                key, f"{ctx.show('train.precision')} needs a scaling recipe, but {ctx.show(key)}; set {key}={names}"
            )
        elif t.precision != precision and ctx.value(key) is not None:
            yield error(
                key,
                f"{ctx.show(key)} does nothing with {ctx.show('train.precision')}; set {key}=null, or "
                f"train.precision={precision}",
            )


RULES = (target_runs_spec, low_precision_has_tensor_cores, recipe_runs_on_generation, recipe_matches_precision)
