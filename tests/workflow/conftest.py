"""A scaffolded team repository under git, and helpers to run real git and real lmspec in it."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers.team_repo import tool_env

Runner = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def sh(tmp_path: Path) -> Runner:
    """Run a command (argv) in a directory; returns the completed process, never raises on exit code."""
    home = tmp_path / "home"
    home.mkdir()
    env = tool_env(home)

    def run(*argv: str | Path, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)

    return run


@pytest.fixture
def team_repo(tmp_path: Path, sh: Runner, lmspec) -> Path:
    """`lmspec init` into a temp dir, then `git init` and a first commit of everything."""
    repo = tmp_path / "team"
    result = lmspec("init", str(repo))
    assert result.code == 0, result.err
    for argv in (
        ["git", "init", "-q", "-b", "main"],
        ["git", "add", "-A"],
        ["git", "commit", "-q", "-m", "specs and builds"],
    ):
        done = sh(*argv, cwd=repo)
        assert done.returncode == 0, done.stderr
    return repo
