"""The Plan: the one input of every emitter, built once from a validated spec.

Frozen, typed, with every derived number from one derivation (`build_plan`), so no emitter
re-derives anything and every artifact agrees with every other. The cost model's numbers (training
memory, communication, step time: most of the derivation's time) are derived from the spec when
first read and kept, so a rank that opens a build (compiler/build/reader.py) does not pay for them.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from lmspec.compiler import __version__
from lmspec.compiler.build.files import run_dir
from lmspec.compiler.errors import Problem, UsageError
from lmspec.compiler.inputs import NOTHING_READ, CompileInputs
from lmspec.compiler.models.checkpoint_size import (
    CheckpointCadence,
    CheckpointSize,
    checkpoint_cadence,
    checkpoint_size,
)
from lmspec.compiler.models.comm import CommEstimate
from lmspec.compiler.models.dims import Device, ParallelDims, device_kind
from lmspec.compiler.models.params import ParamCounts, count_params
from lmspec.compiler.models.samples import SplitSamples, split_samples
from lmspec.compiler.models.serve_layout import ServeLayout, serve_layout
from lmspec.compiler.models.serve_memory import ServeMemory, estimate_serve_memory, served_dtype
from lmspec.compiler.models.serve_perf import ServePerf, perf_dict, serve_perf
from lmspec.compiler.models.serve_roles import ServeNumbers, serve_numbers
from lmspec.compiler.models.steptime import StepTime, estimate_comm_and_step
from lmspec.compiler.models.summary import (
    FlopsSummary,
    cadence_dict,
    checkpoint_dict,
    comm_dict,
    flops_dict,
    flops_summary,
    memory_dict,
    params_dict,
    serve_dict,
)
from lmspec.compiler.models.train_memory import TrainMemory, estimate_train_memory
from lmspec.compiler.models.units import DTYPE_BYTES
from lmspec.compiler.quantize_modules import quantize_dict
from lmspec.compiler.spec.load import Composed
from lmspec.compiler.spec.provenance import Origins
from lmspec.compiler.spec.sections import ConvertSpec, ServingSpec, Spec, TrainingSpec, serving, training


@dataclass(frozen=True, kw_only=True)
class Layout:
    """Every parallel degree, resolved (no `auto` left): ParallelDims' values for this one spec, as plan.json
    records them (compiler/models/dims.py names the four stages of a layout)."""

    world_size: int
    nodes: int
    gpus_per_node: int
    tp: int
    pp: int
    dp: int
    cp: int
    ep: int
    etp: int
    expert_dp: int  # replicas of each expert shard: world / (etp x ep x pp)
    stage_layers: tuple[int, ...]
    virtual_stages: int | None
    sequence_parallel: bool
    zero_stage: int
    distributed_optimizer: bool


@dataclass(frozen=True, kw_only=True)
class Batch:
    micro_batch_size: int
    global_batch_size: int
    grad_accum_steps: int
    seq_length: int
    tokens_per_step: int
    samples: SplitSamples  # what the train and valid splits must supply (Megatron's dataset sizes)


@dataclass(frozen=True, kw_only=True)
class RunPaths:
    """The directories a run writes and reads, relative to the job's working directory."""

    run_dir: str  # runs/<name>/: metrics.jsonl, vllm.log, ... (compiler/build/files.py)


@dataclass(frozen=True, kw_only=True)
class TrainPlan:
    """Training's derived numbers; present when the spec trains. The cost model's (memory, comm, step_time)
    are derived from `spec` when first read: a cached_property writes its value once into the instance's
    own __dict__, which a frozen dataclass allows, and equality stays that of the fields they follow from."""

    spec: TrainingSpec
    layout: Layout
    batch: Batch
    flops: FlopsSummary
    checkpoint: CheckpointSize  # bytes per save, the disk keep_last_k saves hold, the time a save takes

    @cached_property
    def memory(self) -> TrainMemory:
        """Per-GPU training memory of every pipeline stage."""
        memory = estimate_train_memory(self.spec)
        assert memory is not None, "validate() guarantees a legal layout"
        return memory

    @cached_property
    def _priced(self) -> tuple[CommEstimate, StepTime]:
        priced = estimate_comm_and_step(self.spec, self.memory)
        assert priced is not None, "validate() guarantees a legal layout"
        return priced

    @cached_property
    def comm(self) -> CommEstimate:
        """Communication per step against compute, nothing overlapped."""
        return self._priced[0]

    @cached_property
    def step_time(self) -> StepTime:
        """The step time `lmspec plan` ranks this layout by; not in plan.json (`lmspec explain` shows it apart)."""
        return self._priced[1]

    @cached_property
    def cadence(self) -> CheckpointCadence:
        """The checkpoint saves at the estimated step time: the wait for a previous persist, the interval advice."""
        return checkpoint_cadence(self.checkpoint, self.spec, float(self.step_time.total))


@dataclass(frozen=True, kw_only=True)
class ServePlan:
    """Serving's derived numbers; present when the spec serves."""

    spec: ServingSpec
    model_dir: str  # what vLLM serves, relative to the job's working directory
    layout: ServeLayout  # the engine's GPUs, nodes and node roles
    memory: ServeMemory  # per GPU, the same on every node role
    numbers: ServeNumbers  # per node role
    perf: ServePerf  # TTFT, TPOT, throughput and goodput under serve.workload


class MissingPart(UsageError):
    """A command asked for a part of the job the spec does not have (train: null or serve: null): exit 2."""


@dataclass(frozen=True, kw_only=True)
class Plan:
    lmspec_version: str
    spec: Spec
    params: ParamCounts
    train: TrainPlan | None  # None for a serve-only job (train: null)
    serve: ServePlan | None  # None for a train-only job (serve: null)
    overrides: tuple[str, ...]
    choices: tuple[tuple[str, str], ...]
    warnings: tuple[Problem, ...]
    # Not in plan.json (its bytes stay what they were): derived from the spec by build_plan wherever a Plan is made.
    paths: RunPaths
    device: Device
    origins: Origins  # where each key of the spec came from: file:line, an override, or the build's spec file
    # What the compile read from the machine (compiler/inputs.py); not compared: it is no derived number, and a
    # Plan read back from a build (Plan.from_json) holds nothing read.
    inputs: CompileInputs = dataclasses.field(default=NOTHING_READ, compare=False)

    @property
    def name(self) -> str:
        return self.spec.name

    def trained(self) -> TrainPlan:
        """The training part; MissingPart names the key when the job does not train."""
        if self.train is None:
            raise MissingPart(f"{self.name} does not train (train: null): it is a serve-only job")
        return self.train

    def served(self) -> ServePlan:
        """The serving part; MissingPart names the key when the job does not serve."""
        if self.serve is None:
            raise MissingPart(f"{self.name} does not serve (serve: null): it is a train-only job")
        return self.serve

    def conversion(self) -> ConvertSpec:
        """The convert section of a job that trains; MissingPart when there is nothing to convert."""
        if self.spec.convert is None or self.train is None:
            raise MissingPart(f"{self.name} converts no checkpoint (train or convert is null)")
        return self.spec.convert

    def spec_dict(self) -> dict[str, Any]:
        return spec_dict(self.spec)

    def derived_dict(self, cost_model: bool = True) -> dict[str, Any]:
        """Everything lmspec derived, as plain data: what `explain --format json` adds to the spec.
        A part the job does not have is null; cost_model=False leaves out COST_SECTIONS and derives none of them."""
        t, v = self.train, self.serve
        derived = {
            "layout": _plain(dataclasses.asdict(t.layout)) if t else None,
            "batch": dataclasses.asdict(t.batch) if t else None,
            "params": params_dict(self.params),
            "memory": None,  # COST_SECTIONS: filled in below, in this order
            "flops": flops_dict(t.flops) if t else None,
            "serve": (
                {
                    **serve_dict(v.memory),
                    "layout": _plain(dataclasses.asdict(v.layout)),
                    "numbers": _plain(dataclasses.asdict(v.numbers)),
                    "perf": perf_dict(v.perf),
                }
                if v
                else None
            ),
            "comm": None,
            "checkpoint": checkpoint_dict(t.checkpoint) if t else None,
            "checkpoint_cadence": None,
            "quantize": quantize_dict(self.spec, DTYPE_BYTES[kept_dtype(self.spec)]) if self.spec.quantize else None,
        }
        if not cost_model:
            return {key: value for key, value in derived.items() if key not in COST_SECTIONS}
        if t:
            derived.update(
                memory=memory_dict(t.memory),
                comm=comm_dict(t.comm, t.step_time),
                checkpoint_cadence=cadence_dict(t.cadence),
            )
        return derived

    def to_document(self, cost_model: bool = True) -> dict[str, Any]:
        """plan.json's document (compiler/emit/spec_files.py writes it); cost_model as derived_dict's."""
        return {"lmspec_version": self.lmspec_version, **self.derived_dict(cost_model)}

    @classmethod
    def from_json(
        cls, document: Any, spec: Spec, composed: Composed, warnings: list[Problem], *, cost_model: bool = True
    ) -> Plan:
        """plan.json back into the Plan it was written from. The file rounds FLOPs and times to six
        digits, so the Plan is derived again from its verified spec by `build_plan` (the one
        derivation) and the document must be exactly that Plan's: ValueError naming the first
        entry that differs (a plan edited by hand, or from another derivation).
        cost_model=False compares every section but COST_SECTIONS, which need only be there: the Plan
        derives them from the spec if they are ever read, never from the document, so what they hold
        changes nothing that runs, and the cost model is not run (Build.open on every rank)."""
        plan = build_plan(spec, composed, warnings)
        expected = json.loads(json.dumps(plan.to_document(cost_model)))  # tuples as lists, as JSON holds them
        if not cost_model and isinstance(document, dict):
            expected |= {key: document.get(key, _ABSENT) for key in COST_SECTIONS}
        if document != expected:
            raise ValueError(f"its {_first_difference(document, expected)!r} is not what lmspec derives from the spec")
        return plan


def _first_difference(found: Any, expected: Any, path: str = "") -> str:
    """The dotted path of the first entry where `found` is not `expected`."""
    if isinstance(found, dict) and isinstance(expected, dict):
        for key in sorted(set(found) | set(expected), key=str):
            if found.get(key, _MISSING) != expected.get(key, _MISSING):
                return _first_difference(found.get(key), expected.get(key), f"{path}.{key}" if path else str(key))
    if isinstance(found, list) and isinstance(expected, list) and len(found) == len(expected):
        for i, (a, b) in enumerate(zip(found, expected, strict=True)):
            if a != b:
                return _first_difference(a, b, f"{path}.{i}" if path else str(i))
    return path or "<document>"


_MISSING = object()
_ABSENT = object()  # a section the document must have, whatever it holds
# plan.json's sections from the cost model (TrainPlan.memory, .comm, .cadence): most of what deriving a Plan takes
COST_SECTIONS = ("memory", "comm", "checkpoint_cadence")


def spec_dict(spec: Spec) -> dict[str, Any]:
    """The resolved spec as plain data (lists, not tuples), in the sections' order."""
    return _plain(dataclasses.asdict(spec))


def run_paths(spec: Spec) -> RunPaths:
    return RunPaths(run_dir=run_dir(spec.name))


def served_model_dir(spec: ServingSpec) -> str:
    """What vLLM serves: serve.model_path, else the quantize stage's checkpoint (quantize.output), else the
    conversion output (rules.jobs: one of them is set; rules.quantize: serve.model_path is null with quantize)."""
    if spec.serve.model_path is not None:
        return spec.serve.model_path
    if spec.quantize is not None:
        return spec.quantize.output
    assert spec.convert is not None, "rules.jobs.serving_has_a_model"
    return spec.convert.output


def kept_dtype(spec: Spec) -> str:
    """The dtype of the layers the quantize stage keeps (and of w4a16's scales): the served one when the job
    serves (serve.dtype, or the converted one for auto), else convert.dtype."""
    serves = serving(spec)
    if serves is not None:
        return served_dtype(serves)
    assert spec.convert is not None, "rules.quantize: quantize needs a job that converts"
    return spec.convert.dtype


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def build_plan(spec: Spec, composed: Composed, warnings: list[Problem], inputs: CompileInputs = NOTHING_READ) -> Plan:
    """Derive every number from a spec that `validate` accepted."""
    trains, serves = training(spec), serving(spec)
    return Plan(
        lmspec_version=__version__,
        spec=spec,
        params=count_params(spec.model),
        train=train_plan(trains) if trains is not None else None,
        serve=serve_plan(serves) if serves is not None else None,
        overrides=composed.overrides,
        choices=tuple(sorted(composed.choices.items())),
        warnings=tuple(warnings),
        paths=run_paths(spec),
        device=device_kind(spec),
        origins=composed.origins,
        inputs=inputs,
    )


def serve_plan(spec: ServingSpec) -> ServePlan:
    layout, memory = serve_layout(spec), estimate_serve_memory(spec)
    return ServePlan(
        spec=spec,
        model_dir=served_model_dir(spec),
        layout=layout,
        memory=memory,
        numbers=serve_numbers(spec, layout, memory),
        perf=serve_perf(spec, memory),
    )


def train_plan(spec: TrainingSpec) -> TrainPlan:
    p, t = spec.parallel, spec.train
    dims = ParallelDims.from_spec(spec)
    assert dims is not None, "validate() guarantees a legal layout"
    layout = Layout(
        world_size=dims.world,
        nodes=dims.nodes,
        gpus_per_node=dims.gpus_per_node,
        tp=p.tp,
        pp=p.pp,
        dp=dims.dp,
        cp=p.cp,
        ep=p.ep,
        etp=p.etp,
        expert_dp=dims.expert_dp,
        stage_layers=dims.stage_layers,
        virtual_stages=p.virtual_stages,
        sequence_parallel=p.sequence_parallel,
        zero_stage=p.zero_stage,
        distributed_optimizer=p.distributed_optimizer,
    )
    batch = Batch(
        micro_batch_size=t.micro_batch_size,
        global_batch_size=t.global_batch_size,
        grad_accum_steps=dims.micro_batches,
        seq_length=t.seq_length,
        tokens_per_step=t.global_batch_size * t.seq_length,
        samples=split_samples(t),
    )
    return TrainPlan(
        spec=spec,
        layout=layout,
        batch=batch,
        flops=flops_summary(spec, batch.tokens_per_step, dims.world),
        checkpoint=checkpoint_size(spec),
    )
