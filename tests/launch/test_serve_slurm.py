"""`lmspec run BUILD --stage serve` on cluster=slurm, on the real local Slurm of tests/launch: serve/sbatch.sh
is submitted, the job id and the endpoint printed, and `lmspec run` returns while the job runs.

The job runs the real path (sbatch.sh -> launch/nccl.env -> srun -> serve/serve.sh) on a serve-only build
whose model is not on the node, so serve.sh refuses it and no vLLM starts: what is proven is the submission
and that the node ran the build's script; tests/serve/test_serve_runtime.py proves vLLM answering.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.build import compile_build
from helpers.processes import run_in_group

pytestmark = pytest.mark.slow
JOB_TIMEOUT_S = 120


def test_serve_stage_submits_serve_sbatch_and_returns(local_slurm, tmp_path: Path) -> None:  # noqa: ANN001
    overrides = ["cluster=slurm", "train=null", "parallel=null", "convert=null", "serve.model_path=models/absent"]
    build = compile_build(tmp_path / "build", [*overrides, "serve.max_model_len=128"]).dir
    lmspec = Path(sys.executable).with_name("lmspec")

    result = run_in_group([lmspec, "run", str(build)], cwd=tmp_path, timeout_s=JOB_TIMEOUT_S, env=local_slurm.env)

    assert result.returncode == 0, result.stdout + result.stderr
    found = re.search(r"submitted Slurm job (\d+): vLLM on 1 node\(s\)", result.stdout)
    assert found, result.stdout
    job_id = found.group(1)
    assert "clients: http://NODE0:8000/v1" in result.stdout and f"scancel {job_id}" in result.stdout
    log = tmp_path / f"serve-tiny-{job_id}-node0.log"
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while _queued(job_id, local_slurm.env) or not log.exists():
        assert time.monotonic() < deadline, f"job {job_id} did not end"
        time.sleep(0.5)
    assert "serve.sh: no model at models/absent" in log.read_text()


def _queued(job_id: str, env: dict[str, str]) -> bool:
    command = ["squeue", "--noheader", "--jobs", job_id]
    listed = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    return job_id in listed.stdout


def test_serve_smoke_asks_slurm_without_submitting(local_slurm, tmp_path: Path) -> None:  # noqa: ANN001
    overrides = ["cluster=slurm", "train=null", "parallel=null", "convert=null", "serve.model_path=models/absent"]
    build = compile_build(tmp_path / "build", [*overrides, "serve.max_model_len=128"]).dir
    lmspec = Path(sys.executable).with_name("lmspec")

    command = [lmspec, "run", str(build), "--stage", "serve", "--smoke"]
    result = run_in_group(command, cwd=tmp_path, timeout_s=JOB_TIMEOUT_S, env=local_slurm.env)

    assert result.returncode == 0, result.stdout + result.stderr
    assert "smoke: ok serve/sbatch.sh parses (bash -n)" in result.stdout
    assert "smoke: ok serve/serve.sh parses (bash -n)" in result.stdout
    assert "smoke: ok Slurm accepts the job (sbatch --test-only)" in result.stdout
    queue = subprocess.run(["squeue", "--noheader"], env=local_slurm.env, capture_output=True, text=True, check=True)
    assert queue.stdout.strip() == ""  # nothing was submitted
