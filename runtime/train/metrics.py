"""One structured metrics line every `train.log_interval` steps, and the NaN/Inf stop.

Fields: step, loss, lr, grad_norm, tokens_per_s, step_time_s, mfu, peak_memory_bytes
(CUDA max allocated on GPU, this process's peak RSS on CPU), one StepMetrics
(compiler/observe/metrics_record.py, which `lmspec logs` reads back). Tokens per step and
model FLOPs per token (no recompute) are the Plan's, never derived here again; MFU is
`lmspec.compiler.models.flops.mfu` of them against `hardware.gpu.bf16_tflops` per rank.
Rank 0 prints the record's human line on stdout and appends its JSON line to
`<run dir>/metrics.jsonl`; on a terminal a progress bar (rich) shows the step.
The same records also go to TensorBoard and W&B when train.logging asks (runtime/train/metric_sinks.py).
A validation is a record of its own, {"step", "val_loss"}, written whatever the log interval, and the
line `lmspec: validation loss at step N: X`.
"""

from __future__ import annotations

import logging
import math
import os
import resource
import sys
from pathlib import Path

import torch

from lmspec.compiler.build.files import METRICS
from lmspec.compiler.models.flops import mfu
from lmspec.compiler.observe.metrics_record import StepMetrics
from lmspec.compiler.spec.sections import TrainingSpec
from lmspec.runtime.train.metric_sinks import MetricSink, open_sinks

_KIB = 1024
logger = logging.getLogger(__name__)


class NonFiniteLoss(RuntimeError):
    """The loss became NaN or Inf: stop, and say which spec keys to change."""


def peak_memory_bytes() -> int:
    if torch.cuda.is_available():
        return int(torch.cuda.max_memory_allocated())
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * _KIB  # Linux: KiB


def check_finite(step: int, loss: float, spec: TrainingSpec) -> None:
    if math.isfinite(loss):
        return
    t = spec.train
    raise NonFiniteLoss(
        f"loss is {loss} at step {step}: stopping. Usual fixes: train.precision=bf16 "
        f"(now {t.precision}; fp16 overflows), train.grad_clip=1.0 (now {t.grad_clip}), "
        f"or a lower train.optimizer.lr (now {t.optimizer.lr:g}, e.g. {t.optimizer.lr / 5:g})"
    )


def _retire(path: Path) -> None:
    """A run that starts from scratch starts its own metrics file: an earlier run's lines are renamed to
    `metrics.previous-<n>.jsonl` (the first free n), never appended to nor deleted."""
    if not path.exists():
        return
    n = 1
    while (retired := path.with_name(f"{path.stem}.previous-{n}{path.suffix}")).exists():
        n += 1
    os.rename(path, retired)
    logger.info(f"lmspec: an earlier run's {path} moved to {retired}")


class MetricsLog:
    """Measures each step; writes every `log_interval` steps on rank 0. `tokens_per_step` and
    `flops_per_token` are the Plan's (plan.json batch.tokens_per_step, flops.per_token)."""

    def __init__(
        self,
        spec: TrainingSpec,
        run_dir: Path,
        world_size: int,
        is_rank0: bool,
        total_steps: int,
        first_step: int,
        *,
        tokens_per_step: int,
        flops_per_token: float,
        fresh_run: bool = False,
    ) -> None:
        self.spec = spec
        self.is_rank0 = is_rank0
        self.world_size = world_size
        self.tokens_per_step = tokens_per_step
        self.flops_per_token = flops_per_token
        self.path = run_dir / METRICS
        self._progress = None
        self._sinks: list[MetricSink] = []
        if is_rank0:
            run_dir.mkdir(parents=True, exist_ok=True)
            if fresh_run:
                _retire(self.path)
            self._sinks = open_sinks(spec.train.logging, run_dir, spec.name)
            if sys.stdout.isatty():
                from rich.progress import Progress

                self._progress = Progress(transient=True)
                self._task = self._progress.add_task("training", total=total_steps, completed=first_step)
                self._progress.start()

    def record(self, step: int, loss: float, lr: float, grad_norm: float, step_time_s: float) -> StepMetrics:
        check_finite(step, loss, self.spec)
        tokens_per_s = self.tokens_per_step / step_time_s
        entry = StepMetrics(
            step=step,
            loss=loss,
            lr=lr,
            grad_norm=grad_norm,
            tokens_per_s=tokens_per_s,
            step_time_s=step_time_s,
            mfu=mfu(tokens_per_s, self.flops_per_token, self.world_size, self.spec.hardware.gpu.bf16_tflops),
            peak_memory_bytes=peak_memory_bytes(),
        )
        if self._progress is not None:
            self._progress.update(self._task, completed=step)
        if self.is_rank0 and step % self.spec.train.log_interval == 0:
            self._write(entry)
        return entry

    def record_validation(self, step: int, val_loss: float) -> None:
        if self.is_rank0:
            self._write(
                StepMetrics(step=step, val_loss=val_loss), f"lmspec: validation loss at step {step}: {val_loss:.4f}"
            )

    def _write(self, m: StepMetrics, line: str | None = None) -> None:
        line = m.to_text() if line is None else line
        if self._progress is not None:
            self._progress.console.print(line)
        else:
            print(line, flush=True)
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(m.to_json() + "\n")
        for sink in self._sinks:
            sink.write(m)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
        for sink in self._sinks:
            sink.close()
