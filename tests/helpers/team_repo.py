"""Helpers shared by the workflow tests: the tool environment and spec edits."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from lmspec.compiler.cli.init import STARTER_SPEC

VENV_BIN = Path(sys.executable).parent


def tool_env(home: Path) -> dict[str, str]:
    """git/pre-commit/lmspec with this venv first on PATH and no user or system config."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GIT_", "PRE_COMMIT"))}
    env.update(
        PATH=f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}",
        HOME=str(home),
        GIT_CONFIG_NOSYSTEM="1",
        GIT_AUTHOR_NAME="lmspec test",
        GIT_AUTHOR_EMAIL="test@example.com",
        GIT_COMMITTER_NAME="lmspec test",
        GIT_COMMITTER_EMAIL="test@example.com",
        PRE_COMMIT_HOME=str(home / "pre-commit"),
    )
    return env


def starter_spec(repo: Path) -> Path:
    return repo / "specs" / f"{STARTER_SPEC}.yaml"


def set_tp(repo: Path, tp: int) -> None:
    """Edit the starter spec's tensor parallel size, as a user would in their editor."""
    spec = starter_spec(repo)
    lines = spec.read_text(encoding="utf-8").splitlines(keepends=True)
    index = next(i for i, line in enumerate(lines) if line.startswith("  tp: "))
    lines[index] = f"  tp: {tp}\n"
    spec.write_text("".join(lines), encoding="utf-8")
