"""A local single-node Slurm for the launch tests, started once per session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from helpers.slurm import LocalSlurm, slurm_missing_reason


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
