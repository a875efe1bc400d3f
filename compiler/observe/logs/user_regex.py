"""Any other log format: a user regex whose named groups name the fields it captures.

Example: ``--regex 'step (?P<step>\\d+) .* loss (?P<loss>\\S+) .* (?P<step_time_ms>[\\d.]+)ms'``.
Without a ``step`` group, matching lines are numbered 1, 2, 3, ...
"""

from __future__ import annotations

import re

from lmspec.compiler.errors import UsageError
from lmspec.compiler.observe.logs.records import NUMERIC_FIELDS, StepRecord

GROUP_NAMES: tuple[str, ...] = ("step", "step_time_ms", *NUMERIC_FIELDS)
_INT_FIELDS = ("global_batch_size", "peak_memory_bytes", "nan_iterations")


def compile_user_regex(pattern: str) -> re.Pattern[str]:
    try:
        compiled = re.compile(pattern)
    except re.error as exc:
        raise UsageError(f"--regex {pattern!r} is not a valid regular expression: {exc}") from None
    unknown = sorted(set(compiled.groupindex) - set(GROUP_NAMES))
    if unknown or not compiled.groupindex:
        raise UsageError(
            f"--regex named groups {unknown or '(none)'} are not fields lmspec reads; "
            f"use (?P<name>...) with name one of: {', '.join(GROUP_NAMES)}"
        )
    return compiled


def parse_user_line(pattern: re.Pattern[str], text: str, lineno: int, ordinal: int) -> StepRecord | None:
    """ordinal: the step number to use when the regex captures none."""
    match = pattern.search(text)
    if not match:
        return None
    groups = {k: v for k, v in match.groupdict().items() if v is not None}
    try:
        record = StepRecord(step=int(groups.pop("step", ordinal)), line=lineno)
        if "step_time_ms" in groups:
            record.step_time_s = float(groups.pop("step_time_ms")) / 1000
        for name, value in groups.items():
            setattr(record, name, int(float(value)) if name in _INT_FIELDS else float(value))
    except (ValueError, OverflowError):  # not a number, or inf/NaN for a count
        return None
    return record
