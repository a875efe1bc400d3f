"""lmspec's own human metrics line on stdout (runtime/train/metrics.py::MetricsLog._write):
``step     10 | loss 4.1234 | lr 3.000e-03 | grad_norm 0.512 | 4,020 tokens/s | 509 ms/step |
MFU 15.02% | peak mem 393 MiB`` — for a run whose metrics.jsonl is gone but whose output was kept."""

from __future__ import annotations

import re

from lmspec.compiler.observe.logs.records import StepRecord, digits_int, finite_int

_LINE = re.compile(
    r"^step\s+(\d+) \| loss (\S+) \| lr (\S+) \| grad_norm (\S+) \| ([\d,.]+) tokens/s \| ([\d.]+) ms/step \| "
    r"MFU ([\d.]+)% \| peak mem ([\d,.]+) MiB"
)
_MIB_BYTES = 1024 * 1024


def parse_lmspec_line(text: str, lineno: int) -> StepRecord | None:
    if not text.startswith("step "):
        return None
    match = _LINE.search(text)
    if not match:
        return None
    g = match.groups()
    step = digits_int(g[0])
    if step is None:
        return None
    try:  # the format's \S+ and [\d,.]+ also take what is not a number ("1.2.3")
        return StepRecord(
            step=step,
            line=lineno,
            loss=float(g[1]),
            lr=float(g[2]),
            grad_norm=float(g[3]),
            tokens_per_s=float(g[4].replace(",", "")),
            step_time_s=float(g[5]) / 1000,
            mfu=float(g[6]) / 100,
            peak_memory_bytes=finite_int(float(g[7].replace(",", "")) * _MIB_BYTES),
        )
    except ValueError:
        return None
