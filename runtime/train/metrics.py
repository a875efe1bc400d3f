"""One structured metrics line every `train.log_interval` steps, and the NaN/Inf stop.

Fields: step, loss, lr, grad_norm, tokens_per_s, step_time_s, mfu, peak_memory_bytes
(CUDA max allocated on GPU, this process's peak RSS on CPU). MFU uses the FLOPs
model (`lmspec.compiler.models.flops`: model FLOPs per token, no recompute) against
`hardware.gpu.bf16_tflops` per rank. Rank 0 prints a human line on stdout and
appends JSON lines to `<run dir>/metrics.jsonl`; on a terminal a progress bar
(rich) shows the step.
"""

from __future__ import annotations

import json
import math
import os
import resource
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from lmspec.compiler.build.files import METRICS
from lmspec.compiler.models.flops import mfu, model_flops_per_token
from lmspec.compiler.spec.sections import Spec

_KIB = 1024


class NonFiniteLoss(RuntimeError):
    """The loss became NaN or Inf: stop, and say which spec keys to change."""


@dataclass(frozen=True)
class StepMetrics:
    step: int
    loss: float
    lr: float
    grad_norm: float
    tokens_per_s: float
    step_time_s: float
    mfu: float
    peak_memory_bytes: int


def peak_memory_bytes() -> int:
    if torch.cuda.is_available():
        return int(torch.cuda.max_memory_allocated())
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * _KIB  # Linux: KiB


def check_finite(step: int, loss: float, spec: Spec) -> None:
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
    print(f"lmspec: an earlier run's {path} moved to {retired}", flush=True)


class MetricsLog:
    """Collects per-step numbers; writes every `log_interval` steps on rank 0."""

    def __init__(
        self,
        spec: Spec,
        run_dir: Path,
        world_size: int,
        is_rank0: bool,
        total_steps: int,
        first_step: int,
        fresh_run: bool = False,
    ) -> None:
        self.spec = spec
        self.is_rank0 = is_rank0
        self.world_size = world_size
        self.tokens_per_step = spec.train.global_batch_size * spec.train.seq_length
        self.flops_per_token = model_flops_per_token(spec.model, spec.train.seq_length)
        self.path = run_dir / METRICS
        self.history: list[StepMetrics] = []
        self._progress = None
        if is_rank0:
            run_dir.mkdir(parents=True, exist_ok=True)
            if fresh_run:
                _retire(self.path)
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
        self.history.append(entry)
        if self._progress is not None:
            self._progress.update(self._task, completed=step)
        if self.is_rank0 and step % self.spec.train.log_interval == 0:
            self._write(entry)
        return entry

    def _write(self, m: StepMetrics) -> None:
        line = (
            f"step {m.step:>6} | loss {m.loss:.4f} | lr {m.lr:.3e} | grad_norm {m.grad_norm:.3f} | "
            f"{m.tokens_per_s:,.0f} tokens/s | {m.step_time_s * 1000:.0f} ms/step | "
            f"MFU {m.mfu * 100:.2f}% | peak mem {m.peak_memory_bytes / 2**20:,.0f} MiB"
        )
        if self._progress is not None:
            self._progress.console.print(line)
        else:
            print(line, flush=True)
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(asdict(m), sort_keys=True) + "\n")

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
