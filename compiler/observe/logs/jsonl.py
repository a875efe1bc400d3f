"""lmspec's own `metrics.jsonl` (runtime/train/metrics.py): one JSON object per logged step."""

from __future__ import annotations

import json
import math

from lmspec.compiler.observe.logs.records import NUMERIC_FIELDS, StepRecord

_INT_FIELDS = ("global_batch_size", "peak_memory_bytes", "nan_iterations")


def parse_jsonl_line(text: str, lineno: int) -> StepRecord | None:
    """A step record, or None for blank lines, other events and lines that are not JSON."""
    try:
        obj = json.loads(text)  # json reads NaN / Infinity, which a diverged run writes
    except (ValueError, RecursionError):  # not JSON, or nested deeper than json's recursion limit
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("step"), int):
        return None
    record = StepRecord(step=obj["step"], line=lineno)
    for name in NUMERIC_FIELDS:
        value = obj.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            finite_int = name in _INT_FIELDS and math.isfinite(value)
            setattr(record, name, int(value) if finite_int else float(value))
    return record
