"""The spec's sections as typed, frozen dataclasses: one module per group (model, hardware, parallel,
train, serve, cluster, convert, quantize), the whole spec in spec.py, and `key()` in declare.py.

This package is the single source of every key's name, type, bounds, description
and example: `schemas/spec.schema.json` is generated from it (`lmspec schema`),
validation checks against that schema, and after validation the rest of lmspec
holds these objects, never raw dicts. The YAML key, the attribute and the
override prefix are the same word. Import the types from here, not from the
group modules: this is the package's public face.
"""

from __future__ import annotations

from lmspec.compiler.spec.sections.cluster import ClusterSpec, ContainerSpec, NcclSpec, SlurmSpec
from lmspec.compiler.spec.sections.convert import ConvertSpec
from lmspec.compiler.spec.sections.declare import Auto, key
from lmspec.compiler.spec.sections.hardware import GpuSpec, HardwareSpec, InterNodeSpec, IntraNodeSpec
from lmspec.compiler.spec.sections.model import ROPE_SCALING_FIELDS, MlaSpec, ModelSpec, MoeSpec, RopeScalingSpec
from lmspec.compiler.spec.sections.parallel import OverlapSpec, ParallelSpec
from lmspec.compiler.spec.sections.quantize import CalibrationSpec, QuantizeSpec
from lmspec.compiler.spec.sections.serve import ServeSpec
from lmspec.compiler.spec.sections.spec import ServingSpec, Spec, TrainingSpec, serving, training
from lmspec.compiler.spec.sections.train import (
    CheckpointSpec,
    DataSourceSpec,
    DataSpec,
    LoggingSpec,
    LrScheduleSpec,
    MegatronSection,
    MegatronSpec,
    OptimizerSpec,
    TrainMoeSpec,
    TrainSpec,
    WandbSpec,
)

__all__ = [
    "ROPE_SCALING_FIELDS",
    "Auto",
    "CalibrationSpec",
    "CheckpointSpec",
    "ClusterSpec",
    "ContainerSpec",
    "ConvertSpec",
    "DataSourceSpec",
    "DataSpec",
    "GpuSpec",
    "HardwareSpec",
    "InterNodeSpec",
    "IntraNodeSpec",
    "LoggingSpec",
    "LrScheduleSpec",
    "MegatronSection",
    "MegatronSpec",
    "MlaSpec",
    "ModelSpec",
    "MoeSpec",
    "NcclSpec",
    "OptimizerSpec",
    "OverlapSpec",
    "ParallelSpec",
    "QuantizeSpec",
    "RopeScalingSpec",
    "ServeSpec",
    "ServingSpec",
    "SlurmSpec",
    "Spec",
    "TrainMoeSpec",
    "TrainSpec",
    "TrainingSpec",
    "WandbSpec",
    "key",
    "serving",
    "training",
]
