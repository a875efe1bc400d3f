"""Submitting a build's sbatch script: the one owner of the sbatch command line and its job id.

Training follows its job to the end (`sbatch --wait`), serving submits an
engine that runs until cancelled and returns (both in runtime/launchers/slurm.py). Both read the job id from
sbatch's first line (--parsable: `ID` or `ID;CLUSTER`) and name the missing Slurm client the same way.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from lmspec.compiler.errors import UsageError
from lmspec.compiler.launchers import launcher_of
from lmspec.compiler.spec.sections import ClusterSpec


def sbatch_command(script: Path, args: tuple[str, ...] | list[str], *, wait: bool) -> list[str]:
    """`sbatch --parsable [--wait] SCRIPT ARGS...`: --wait blocks until the job ends (its exit code is the job's)."""
    return ["sbatch", "--parsable", *(["--wait"] if wait else []), str(script), *args]


def sbatch_test_command(script: Path, args: tuple[str, ...] | list[str]) -> list[str]:
    """`sbatch --test-only SCRIPT ARGS...`: Slurm says whether it would accept the job, and submits nothing."""
    return ["sbatch", "--test-only", str(script), *args]


def submit(command: list[str], env: dict[str, str]) -> tuple[subprocess.Popen[str], str]:
    """Start `command` (sbatch_command's) in its own session; (the sbatch process, the job id), the id
    empty when sbatch refused the script (it printed why on stderr)."""
    try:
        proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True, start_new_session=True)
    except FileNotFoundError:
        raise UsageError("sbatch not found: cluster.launcher=slurm needs Slurm's client commands on PATH") from None
    assert proc.stdout is not None
    return proc, proc.stdout.readline().strip().split(";")[0]


def in_container(cluster: ClusterSpec) -> bool:
    """Whether every node's launcher runs in a container image (cluster.slurm.container, under Slurm): then the
    image's interpreter and vLLM run, not this machine's, so lmspec run names neither."""
    return launcher_of(cluster).container and cluster.slurm.container.image is not None
