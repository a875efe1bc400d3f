"""DeepSpeed text logs.

Formats read from deepspeedai/DeepSpeed:
- `deepspeed/runtime/engine.py::_report_progress` through `utils/logging.py::log_dist`:
  ``[Rank 0] step=10, skipped=0, lr=[0.0003], mom=[(0.9, 0.95)]``;
- `deepspeed/utils/timer.py::ThroughputTimer.stop`:
  ``epoch=0/micro_step=20/global_step=10, RunningAvgSamplesPerSec=45.3,
  CurrSamplesPerSec=46.1, MemAllocated=12.5GB, MaxMemAllocated=30.1GB`` (GB = 1024**3 bytes;
  CurrSamplesPerSec = train_batch_size / time of the step); releases before 0.4 print
  ``[INFO] [timer.py:157:stop] 0/10, SamplesPerSec=1.8825260836384787`` (epoch/global step);
- its configuration printout (train_batch_size) is read by `lmspec.compiler.observe.logs.settings`.
The engine logs no loss itself; a training script's own loss lines need `--regex`.
"""

from __future__ import annotations

import re

from lmspec.compiler.models.units import GIB
from lmspec.compiler.observe.metrics_record import StepMetrics, digits_int, finite_int

_STEP = re.compile(r"\[Rank -?\d+\] step=(\d+), skipped=(\d+), lr=\[([^\]]*)\]")
_THROUGHPUT = re.compile(
    r"epoch=\d+/micro_step=\d+/global_step=(\d+), RunningAvgSamplesPerSec=([^,]+), "
    r"CurrSamplesPerSec=([^,]+), MemAllocated=([\d.]+)GB, MaxMemAllocated=([\d.]+)GB"
)
_OLD_TIMER = re.compile(r"\b\d+/(\d+), SamplesPerSec=(\d+\.?\d*(?:[eE][-+]?\d+)?)")
_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


def parse_deepspeed_line(text: str, lineno: int) -> StepMetrics | None:
    if "step=" not in text:  # both line kinds carry it; most lines of a big log do not
        if "SamplesPerSec=" in text and (old := _OLD_TIMER.search(text)):
            step = digits_int(old.group(1))
            return None if step is None else StepMetrics(step=step, line=lineno, samples_per_s=float(old.group(2)))
        return None
    match = _STEP.search(text)
    if match:
        step = digits_int(match.group(1))
        lr = _NUMBER.search(match.group(3))
        return None if step is None else StepMetrics(step=step, line=lineno, lr=float(lr.group(0)) if lr else None)
    match = _THROUGHPUT.search(text)
    if match:
        step = digits_int(match.group(1))
        if step is None:
            return None
        try:  # the format's [^,]+ and [\d.]+ also take what is not a number ("1.2.3")
            return StepMetrics(
                step=step,
                line=lineno,
                samples_per_s=float(match.group(3)),
                peak_memory_bytes=finite_int(float(match.group(5)) * GIB),
            )
        except ValueError:
            return None
    return None
