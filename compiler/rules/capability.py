"""Rules of what the spec's training target runs, built from the one capability table.

Every refusal names the key that asks for the feature, why the target lacks it, the targets on
the same device that run it (the keys to change) and the key's value that does without it.
`lmspec plan` drops exactly what `target_runs_spec` refuses: it calls `runs_spec` (compiler/search).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

from lmspec.compiler.capabilities import (
    FEATURE_KEYS,
    NO_TARGET,
    Capabilities,
    Feature,
    Target,
    capabilities_of,
    requested_features,
    target_of,
    targets_running,
)
from lmspec.compiler.errors import Problem, error
from lmspec.compiler.models.dims import Device
from lmspec.compiler.rules.context import TrainingContext
from lmspec.compiler.spec.override_text import override_value
from lmspec.compiler.spec.sections import TrainingSpec

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


def fp8_has_tensor_cores(ctx: TrainingContext) -> Iterator[Problem]:
    """On a target that runs FP8 (one that does not is refused by target_runs_spec, once)."""
    t, gpu = ctx.spec.train, ctx.spec.hardware.gpu
    caps = capabilities_of(ctx.spec)
    if t.precision == "fp8" and caps is not None and caps.runs("precision_fp8") and gpu.fp8_tflops is None:
        yield error(
            "train.precision",
            (
                f"{ctx.show('train.precision')} needs FP8 tensor cores, but {ctx.show('hardware.gpu.fp8_tflops')} "
                f"({gpu.name} has none; Hopper and Ada do); set train.precision=bf16"
            ),
        )


def fp8_recipe_matches_precision(ctx: TrainingContext) -> Iterator[Problem]:
    """A recipe without FP8 would do nothing; FP8 without a recipe leaves the scaling unsaid."""
    t = ctx.spec.train
    if t.precision == "fp8" and t.fp8_recipe is None:
        yield error(
            "train.fp8_recipe",
            (
                f"{ctx.show('train.precision')} needs a scaling recipe, but {ctx.show('train.fp8_recipe')}; set "
                "train.fp8_recipe=delayed (per-tensor, amax history) or blockwise (DeepSeek-V3's per-block scales)"
            ),
        )
    elif t.precision != "fp8" and t.fp8_recipe is not None:
        yield error(
            "train.fp8_recipe",
            (
                f"{ctx.show('train.fp8_recipe')} does nothing with {ctx.show('train.precision')}; "
                "set train.fp8_recipe=null, or train.precision=fp8"
            ),
        )


RULES = (target_runs_spec, fp8_has_tensor_cores, fp8_recipe_matches_precision)
