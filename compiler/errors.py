"""Problems found in a spec, and the two ways lmspec fails: invalid spec, or bad usage."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Severity = Literal["error", "warning"]


@dataclass(frozen=True)
class Problem:
    """One finding; `message` already names the key, its value, its origin and the fix."""

    severity: Severity
    key: str
    message: str

    def line(self) -> str:
        return f"{self.severity}: {self.message}"


def error(key: str, message: str) -> Problem:
    return Problem("error", key, message)


def warning(key: str, message: str) -> Problem:
    return Problem("warning", key, message)


class SpecError(ValueError):
    """The spec is invalid (exit 1). Carries every problem found, errors first."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = sorted(problems, key=lambda p: (p.severity != "error", p.key))
        super().__init__("\n".join(p.line() for p in self.problems))


class UsageError(Exception):
    """The command line or the file system is wrong (exit 2)."""
