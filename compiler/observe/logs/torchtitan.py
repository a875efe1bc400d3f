"""torchtitan text logs.

Format read from pytorch/torchtitan `torchtitan/components/metrics.py::MetricsProcessor.log`:
``[rank0]:[titan] 2025-06-16 22:30:50,322 - root - INFO - step: 200  loss:  6.1384  grad_norm:  1.6558
memory: 49.66GiB(52.28%)  tps: 5,856  tflops: 339.16  mfu: 34.29%`` — a terminal gets each field in
an ANSI colour; memory is the peak reserved GiB, tps tokens per second per device, tflops and mfu
per device against torchtitan's own peak.
"""

from __future__ import annotations

import re

from lmspec.compiler.models.units import GIB
from lmspec.compiler.observe.metrics_record import StepMetrics, digits_int, finite_int

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_STEP = re.compile(r"\bstep:\s*(\d+)\s+loss:\s*(.*)$")
_FIELD = re.compile(r"(?:^|\s)(\w+):\s*([-+]?(?:[\d,]*\.?\d+(?:[eE][-+]?\d+)?|nan|inf))(GiB|%)?", re.IGNORECASE)


def parse_torchtitan_line(text: str, lineno: int) -> StepMetrics | None:
    if "step:" not in text:
        return None
    match = _STEP.search(_ANSI.sub("", text) if "\x1b" in text else text)
    if not match:
        return None
    step = digits_int(match.group(1))
    if step is None:
        return None
    values: dict[str, float | int] = {}
    for name, shown, unit in _FIELD.findall("loss: " + match.group(2)):
        try:
            number = float(shown.replace(",", ""))
        except ValueError:
            continue
        if name == "loss":
            values["loss"] = number
        elif name == "grad_norm":
            values["grad_norm"] = number
        elif name == "memory" and unit == "GiB" and (peak := finite_int(number * GIB)) is not None:
            values["peak_memory_bytes"] = peak
        elif name == "tps":
            values["tokens_per_s_per_gpu"] = number
        elif name == "tflops":
            values["tflops_per_gpu"] = number
        elif name == "mfu":
            values["mfu"] = number / 100 if unit == "%" else number
    return StepMetrics.of(step, lineno, values)
