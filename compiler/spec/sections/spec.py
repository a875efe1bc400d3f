"""The whole spec, one key per group, and its two narrowed views: TrainingSpec and ServingSpec let
training's and serving's code read train/parallel and serve without testing them for null."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TypeVar

from lmspec.compiler.spec import kinds
from lmspec.compiler.spec.sections.cluster import ClusterSpec
from lmspec.compiler.spec.sections.convert import ConvertSpec
from lmspec.compiler.spec.sections.declare import key
from lmspec.compiler.spec.sections.hardware import HardwareSpec
from lmspec.compiler.spec.sections.model import ModelSpec
from lmspec.compiler.spec.sections.parallel import ParallelSpec
from lmspec.compiler.spec.sections.quantize import QuantizeSpec
from lmspec.compiler.spec.sections.serve import ServeSpec
from lmspec.compiler.spec.sections.train import TrainSpec

_S = TypeVar("_S", bound="Spec")
# Sections a spec may leave out, read as null: groups whose default is none, added after spec files that
# name every group were written (lmspec.compiler.spec.load fills them in), so those files compose as before.
ABSENT_IS_NULL = ("quantize",)


@dataclass(frozen=True, kw_only=True)
class Spec:
    """A whole lmspec job: model, hardware, layout, training, launch, conversion, quantization and serving.

    Three kinds of job: train and serve; train only (serve: null); serve only (train: null, which
    leaves parallel and convert unread and serves serve.model_path)."""

    name: str = key(
        "Job name: the build directory build/<name>/ and the Slurm job name.",
        example="llama3_8b",
        kind=kinds.PLAIN_NAME,
    )
    model: ModelSpec = key("Model architecture.")
    hardware: HardwareSpec = key("Hardware.")
    parallel: ParallelSpec | None = key("Training's parallel layout; null (or unread) in a serve-only job.")
    train: TrainSpec | None = key("Training; null = a serve-only job (serve.model_path is served).")
    cluster: ClusterSpec = key("Launch.")
    convert: ConvertSpec | None = key("Conversion of training checkpoints; null = none (serve-only jobs).")
    quantize: QuantizeSpec | None = key(
        "Post-training quantization of the converted model (llm-compressor), served in its place; null = none."
    )
    serve: ServeSpec | None = key("Serving; null = a train-only job.")


@dataclass(frozen=True, kw_only=True)
class TrainingSpec(Spec):
    """A spec that trains (train and parallel set): the type training's models, rules, emitters and
    runtime read, so none of them tests for a missing section."""

    parallel: ParallelSpec
    train: TrainSpec


@dataclass(frozen=True, kw_only=True)
class ServingSpec(Spec):
    """A spec that serves (serve set): the type serving's models, rules, emitters and runtime read."""

    serve: ServeSpec


def _narrowed(cls: type[_S], spec: Spec) -> _S:
    return cls(**{f.name: getattr(spec, f.name) for f in dataclasses.fields(Spec)})


def training(spec: Spec) -> TrainingSpec | None:
    """The spec as a TrainingSpec, or None for a serve-only job (train: null) or one without a layout."""
    if isinstance(spec, TrainingSpec):
        return spec
    if spec.train is None or spec.parallel is None:
        return None
    return _narrowed(TrainingSpec, spec)


def serving(spec: Spec) -> ServingSpec | None:
    """The spec as a ServingSpec, or None for a train-only job (serve: null)."""
    if isinstance(spec, ServingSpec):
        return spec
    return None if spec.serve is None else _narrowed(ServingSpec, spec)
