"""pre-commit, for real: lmspec's published hooks via `try-repo`, and the scaffolded config.

Both hook kinds are `language: system` (the lmspec on PATH), so nothing is downloaded."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.paths import ROOT
from helpers.team_repo import VENV_BIN, set_tp

from lmspec.compiler.cli.init import STARTER_SPEC

PRE_COMMIT = VENV_BIN / "pre-commit"
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not PRE_COMMIT.exists(), reason="pre-commit is not installed in this environment"),
]


def test_try_repo_runs_lmspecs_published_hooks(team_repo: Path, sh) -> None:
    if not (ROOT / ".git").exists():
        pytest.skip("try-repo needs lmspec as a git repository")
    for hook in ("lmspec-check", "lmspec-compile-check"):
        done = sh(PRE_COMMIT, "try-repo", ROOT, hook, "--all-files", cwd=team_repo, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "Passed" in done.stdout
    set_tp(team_repo, 4)  # edit a spec, forget to recompile
    done = sh(PRE_COMMIT, "try-repo", ROOT, "lmspec-compile-check", "--all-files", cwd=team_repo, timeout=300)
    assert done.returncode == 1 and "Failed" in done.stdout and "is stale" in done.stdout


def test_scaffolded_config_blocks_a_commit_with_a_stale_build(team_repo: Path, sh) -> None:
    assert sh(PRE_COMMIT, "install", cwd=team_repo).returncode == 0
    set_tp(team_repo, 4)
    assert sh("git", "add", "-A", cwd=team_repo).returncode == 0
    blocked = sh("git", "commit", "-m", "tp 4", cwd=team_repo, timeout=300)
    output = blocked.stdout + blocked.stderr  # git runs the hook with its output on stderr
    assert blocked.returncode == 1 and "lmspec compile --check" in output and "is stale" in output
    assert sh(VENV_BIN / "lmspec", "compile", "--spec", f"specs/{STARTER_SPEC}.yaml", cwd=team_repo).returncode == 0
    assert sh("git", "add", "-A", cwd=team_repo).returncode == 0
    done = sh("git", "commit", "-m", "tp 4, build refreshed", cwd=team_repo, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
