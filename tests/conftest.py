"""Shared fixtures: run the CLI in-process, and the project's paths."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from lmspec.compiler.cli.main import run

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class CliResult:
    code: int
    out: str
    err: str

    def assert_reports(self, code: int, fragments: list[str]) -> None:
        """Exit `code`, every fragment on stderr, and no traceback: the golden-error contract."""
        assert self.code == code, self.err
        for fragment in fragments:
            assert fragment in self.err, f"missing {fragment!r} in:\n{self.err}"
        assert "Traceback" not in self.err


@pytest.fixture
def lmspec(capsys: pytest.CaptureFixture[str]) -> Callable[..., CliResult]:
    """Run `lmspec ARGS...` in this process and capture its exit code and output."""

    def invoke(*argv: str) -> CliResult:
        capsys.readouterr()
        code = run(list(argv))
        captured = capsys.readouterr()
        return CliResult(code, captured.out, captured.err)

    return invoke
