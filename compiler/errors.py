"""Problems found in a spec, the two ways lmspec fails (invalid spec, bad usage), and the exit
codes every lmspec command and runtime stage returns."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

Severity = Literal["error", "warning"]

EXIT_OK = 0
EXIT_FAILED = 1  # the spec is invalid, a build is stale, or a run or check failed
EXIT_USAGE = 2  # the command line or the file system is wrong (UsageError)


@dataclass(frozen=True)
class Problem:
    """One finding; `message` already names the key, its value, its origin and the fix."""

    severity: Severity
    key: str
    message: str

    def line(self) -> str:
        return f"{self.severity}: {self.message}"


def print_problems(problems: Iterable[Problem]) -> None:
    """One line per problem on stderr: what every command shows a user instead of a traceback."""
    for problem in problems:
        print(problem.line(), file=sys.stderr)


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
