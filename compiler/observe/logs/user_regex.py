"""Any other log format: a user regex whose named groups name the fields it captures.

Example: ``--regex 'step (?P<step>\\d+) .* loss (?P<loss>\\S+) .* (?P<step_time_ms>[\\d.]+)ms'``.
Without a ``step`` group, matching lines are numbered 1, 2, 3, ... A captured number may carry
thousands separators (``5,856``); an ``mfu`` written as a percentage (``34.29%``, the ``%`` inside
the group or right after it) is read as the fraction lmspec keeps.
"""

from __future__ import annotations

import re

from lmspec.compiler.errors import UsageError
from lmspec.compiler.observe.metrics_record import INT_FIELDS, METRIC_FIELDS, StepMetrics

GROUP_NAMES: tuple[str, ...] = ("step", "step_time_ms", *METRIC_FIELDS)


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


def _number(name: str, shown: str, match: re.Match[str]) -> int | float:
    """A captured value as its field keeps it: separators dropped, a percentage as a fraction."""
    text = shown.strip().replace(",", "").replace("_", "")
    percent = text.endswith("%") or match.string[match.end(name) : match.end(name) + 1] == "%"
    value = float(text.removesuffix("%"))
    if percent and name == "mfu":
        value /= 100
    return int(value) if name in INT_FIELDS else value


def parse_user_line(pattern: re.Pattern[str], text: str, lineno: int, ordinal: int) -> StepMetrics | None:
    """ordinal: the step number to use when the regex captures none."""
    match = pattern.search(text)
    if not match:
        return None
    groups = {k: v for k, v in match.groupdict().items() if v is not None}
    try:
        step = int(groups.pop("step", ordinal))
        values = {name: _number(name, value, match) for name, value in groups.items()}
        if "step_time_ms" in values:  # a step_time_s the regex captures too wins
            values.setdefault("step_time_s", values.pop("step_time_ms") / 1000)
    except (ValueError, OverflowError):  # not a number, or inf/NaN for a count
        return None
    return StepMetrics.of(step, lineno, values)
