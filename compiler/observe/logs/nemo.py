"""NeMo 2 text logs: the iteration lines of its ProgressPrinter.

Format read from NVIDIA/NeMo `nemo/lightning/pytorch/callbacks/progress_printer.py::ProgressPrinter`
(NeMo 2.x, the default progress callback of its Megatron strategy and of Megatron-Bridge-era recipes):
``Training epoch {epoch}, iteration {n}/{total}`` then `` | {metric}: {value}`` per logged metric
(a value that is a whole float printed as an int, others as ``{:.4}``), e.g. from
https://github.com/NVIDIA-BioNeMo/bionemo-recipes/pull/740:
``Training epoch 0, iteration 120/149 | lr: 3e-05 | consumed_samples: 121 | global_batch_size: 1 |
global_step: 120 | reduced_train_loss: 1.233 | train_step_timing in s: 0.03146 | val_loss: 4.106``
and from https://github.com/NVIDIA-NeMo/Speech/pull/10128 (no timing callback):
``Training epoch 0, iteration 0/9 | lr: 0.0006 | consumed_samples: 32 | global_batch_size: 32 |
global_step: 0 | reduced_train_loss: 11.02``.

The step is ``global_step + 1`` where the line states it: NeMo logs ``trainer.global_step`` from
inside the step (0 for the first; ``consumed_samples`` is ``(global_step + 1) * global_batch_size``
in both threads), and lmspec, Megatron and Lightning's bar count the steps done (1 for the first).
Without it, the iteration as printed (it is 0-based in the releases of those threads and the count
of optimizer steps done in later ones). The metrics other than ``global_step`` are averages over the
printer's log interval. ``val_loss`` repeats the last validation on every line and is not read as a
step's own; ``TFLOPS_per_GPU`` is NeMo's FLOPsMeasurementCallback's.
Megatron's reader would take these lines for its own ("iteration N/M |"): this one runs first.
"""

from __future__ import annotations

import re

from lmspec.compiler.observe.metrics_record import StepMetrics, digits_int, field_value, finite_int

_ITERATION = re.compile(r"\bepoch\s+\d+,\s*iteration\s+(\d+)/\s*\d+\s*((?:\|.*)?)$")

# NeMo metric name (lower case) -> (record field, scale applied to the value)
_FIELDS: dict[str, tuple[str, float]] = {
    "lr": ("lr", 1.0),
    "global_batch_size": ("global_batch_size", 1.0),
    "reduced_train_loss": ("loss", 1.0),
    "train_step_timing in s": ("step_time_s", 1.0),
    "tflops_per_gpu": ("tflops_per_gpu", 1.0),
    "grad_norm": ("grad_norm", 1.0),
}


def parse_nemo_line(text: str, lineno: int) -> StepMetrics | None:
    if ", iteration " not in text:  # cheap pre-check: most lines of a big log lack it
        return None
    match = _ITERATION.search(text)
    if match is None:
        return None
    values: dict[str, float | int] = {}
    global_step: int | None = None
    for part in match.group(2).split("|"):
        name, sep, shown = part.rpartition(":")
        if not sep:
            continue
        name = name.strip().lower()
        try:
            number = float(shown.strip())
        except ValueError:
            continue
        if name == "global_step":
            global_step = finite_int(number)
            continue
        target = _FIELDS.get(name)
        if target is None:
            continue
        if (value := field_value(target[0], number * target[1])) is not None:
            values[target[0]] = value
    step = global_step + 1 if global_step is not None and global_step >= 0 else digits_int(match.group(1))
    if step is None:
        return None
    return StepMetrics.of(step, lineno, values)
