"""The job a log came from: its spec and derived numbers, from a build directory or from flags.

Model FLOPs, tokens per step, GPU count and peak come from here, never from the log, and are the
Plan's own numbers (the typed Plan of Build.open), never derived again, so MFU uses what launched the run.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from lmspec.compiler.errors import UsageError

if TYPE_CHECKING:
    from lmspec.compiler.plan import Plan
    from lmspec.compiler.spec.sections import Spec, TrainingSpec


@dataclass(frozen=True)
class RunContext:
    plan: Plan  # the typed Plan: of a verified build (Build.open), or built from flags
    origin: str  # where the spec came from, for the report header

    @property
    def spec(self) -> Spec:
        return self.plan.spec

    @property
    def trains(self) -> bool:
        """Whether the job has a training part: the training numbers below exist only then."""
        return self.plan.train is not None

    @property
    def training(self) -> TrainingSpec:
        """The spec of the training run that wrote the log; UsageError (MissingPart) for a serve-only job."""
        return self.plan.trained().spec

    @property
    def n_gpus(self) -> int:
        return self.plan.trained().layout.world_size

    @property
    def seq_length(self) -> int:
        return self.training.train.seq_length

    @property
    def tokens_per_step(self) -> int:
        return self.plan.trained().batch.tokens_per_step

    @property
    def flops_per_token(self) -> float:
        """Model FLOPs per token (forward + backward): MFU's numerator."""
        return self.plan.trained().flops.per_token

    @property
    def hardware_flops_per_token(self) -> float:
        """Model FLOPs plus the forward work recompute repeats: HFU's numerator."""
        return self.plan.trained().flops.hardware_per_token

    @property
    def peak_tflops_per_gpu(self) -> float:
        return self.plan.trained().flops.peak_tflops_per_gpu


def load_build(build_dir: Path) -> RunContext:
    """The verified spec and plan of a compiled build (compiler/build/reader.py: refused when damaged),
    with the rules' warnings, which the report lists and Build.open (the runtime's reader) does not run."""
    import dataclasses

    from lmspec.compiler.build.reader import Build
    from lmspec.compiler.inputs import read_inputs
    from lmspec.compiler.rules import rule_problems

    build = Build.open(build_dir, cost_model=True)
    found = rule_problems(build.spec, build.plan.origins, read_inputs(build.spec))
    warnings = tuple(p for p in found if p.severity == "warning")
    return RunContext(plan=dataclasses.replace(build.plan, warnings=warnings), origin=str(build_dir))


def flag_overrides(
    model: str | None,
    hardware: str | None,
    gpus: int | None,
    seq_length: int | None,
    extra: list[str],
    spec_file: Path | None = None,
) -> list[str]:
    """Hydra overrides for a job described by flags; `gpus` fills whole nodes of the hardware."""
    from lmspec.compiler.spec.load import compose_spec

    overrides = [f"model={model}"] if model else []
    overrides += [f"hardware={hardware}"] if hardware else []
    if seq_length is not None:
        overrides.append(f"train.seq_length={seq_length}")
    if gpus is not None:
        hw = compose_spec(overrides + extra, spec_file).spec["hardware"]
        per_node = int(hw["gpus_per_node"])
        if gpus < per_node:
            overrides += [f"hardware.gpus_per_node={gpus}", "hardware.nodes=1"]
        elif gpus % per_node:
            raise UsageError(
                f"--gpus {gpus} is not a whole number of {hw['name']} nodes "
                f"({per_node} GPUs each); use a multiple of {per_node}"
            )
        else:
            overrides.append(f"hardware.nodes={gpus // per_node}")
    return overrides + extra


def load_flags(
    model: str | None,
    hardware: str | None,
    gpus: int | None,
    seq_length: int | None,
    extra: list[str],
    spec_file: Path | None = None,
) -> RunContext:
    """Resolve a job from flags through the spec tree and the Plan: a rule the job breaks (a CPU preset's
    memory, a default sequence longer than the model takes) is reported with the numbers, not instead."""
    from lmspec.compiler.pipeline import plan_despite_rules

    overrides = flag_overrides(model, hardware, gpus, seq_length, extra, spec_file)
    plan = plan_despite_rules(overrides, spec_file)
    origin = " ".join(([f"--spec {spec_file}"] if spec_file else []) + overrides) or "spec defaults"
    return RunContext(plan=plan, origin=origin)
