"""Where a metrics record also goes when the spec asks: TensorBoard and Weights & Biases (`train.logging`).

metrics.jsonl stays the one record `lmspec logs` reads; these are views of the same records for the tools
teams already watch, as Megatron-LM (--tensorboard-dir, --wandb-project) and torchtitan ([metrics]) write them.
Each scalar is the record's field under its metrics.jsonl name (loss, lr, grad_norm, val_loss, ...), at its
step. W&B runs offline unless train.logging.wandb.mode=online: nothing leaves the machine by default, and the
files under runs/<name>/wandb upload later with `wandb sync`. Only the rank that writes metrics.jsonl opens
them (MetricsLog); each package is imported only when its sink is on, so neither is needed otherwise.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, Protocol

from lmspec.compiler.build.files import TENSORBOARD_DIR
from lmspec.compiler.observe.metrics_record import METRIC_FIELDS, StepMetrics
from lmspec.compiler.spec.sections import LoggingSpec


class MetricSink(Protocol):
    def write(self, m: StepMetrics) -> None: ...

    def close(self) -> None: ...


def scalars(m: StepMetrics) -> dict[str, float]:
    """The record's fields that are set, by their metrics.jsonl names."""
    values = {name: getattr(m, name) for name in METRIC_FIELDS}
    return {name: float(v) for name, v in values.items() if v is not None}


def _require(module: str, key: str) -> Any:
    """The package a sink needs, or an error that says how to get it or turn the sink off."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"{key} needs the {module} package in every rank's interpreter: pip install {module}, "
            f"or compile without {key}"
        ) from exc


class TensorBoardSink:
    """torch.utils.tensorboard's SummaryWriter on runs/<name>/tensorboard."""

    def __init__(self, run_dir: Path) -> None:
        _require("tensorboard", "train.logging.tensorboard=true")  # torch.utils.tensorboard's own import needs it
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(run_dir / TENSORBOARD_DIR))

    def write(self, m: StepMetrics) -> None:
        for name, value in scalars(m).items():
            self.writer.add_scalar(name, value, m.step)
        self.writer.flush()  # a crash or a requeue keeps every step written so far

    def close(self) -> None:
        self.writer.close()


class WandbSink:
    """One W&B run per launch, its files under runs/<name>/wandb."""

    def __init__(self, run_dir: Path, project: str, mode: str, name: str) -> None:
        wandb = _require("wandb", f"train.logging.wandb.project={project}")
        self.run = wandb.init(project=project, mode=mode, dir=str(run_dir), name=name)

    def write(self, m: StepMetrics) -> None:
        self.run.log(scalars(m), step=m.step)

    def close(self) -> None:
        self.run.finish()


def open_sinks(spec: LoggingSpec, run_dir: Path, name: str) -> list[MetricSink]:
    """The sinks `spec` turns on, opened (run_dir exists)."""
    sinks: list[MetricSink] = []
    if spec.tensorboard:
        sinks.append(TensorBoardSink(run_dir))
    if spec.wandb.project is not None:
        sinks.append(WandbSink(run_dir, spec.wandb.project, spec.wandb.mode, name))
    return sinks
