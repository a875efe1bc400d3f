"""The emitted sbatch.sh on a real (local, single-node) Slurm: 2 ranks run, exit codes propagate.

The launch path is the real one (sbatch -> srun -> launch/torchrun.sh -> nccl.env ->
torch.distributed.run with c10d rendezvous); the trainer module is swapped for a 2-rank gloo
all-reduce by an LMSPEC_PYTHON wrapper, except in the test that runs the real tiny training.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.build import compile_build
from helpers.ports import free_port
from helpers.processes import run_in_group
from helpers.swap_trainer import write_wrapper

from lmspec.compiler.build.files import SBATCH_SH

pytestmark = pytest.mark.slow
CREDENTIAL_REVOKE_GRACE_S = 2.0  # slurmd compares credential and revocation times in whole seconds
JOB_TIMEOUT_S = 300  # the real tiny training takes ~40 s alone, longer on a loaded 2-core CI machine


@pytest.fixture
def tiny_slurm_build(tmp_path: Path) -> Path:
    return compile_build(tmp_path / "build", ["cluster=slurm", f"cluster.master_port={free_port()}"]).dir


def _env(local_slurm, tmp_path: Path, **extra: str) -> dict[str, str]:
    wrapper = write_wrapper(tmp_path)
    out = tmp_path / "ranks"
    out.mkdir()
    return dict(local_slurm.env, LMSPEC_PYTHON=str(wrapper), ALLREDUCE_OUT=str(out), **extra)


def _run(command: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run in its own session; on timeout cancel every job of this cluster and kill the group."""
    return run_in_group(
        command,
        cwd=cwd,
        timeout_s=JOB_TIMEOUT_S,
        env=env,
        on_timeout=lambda: subprocess.run(["scancel", "--user=root"], env=env, check=False),
    )


def _ranks(env: dict[str, str]) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(Path(env["ALLREDUCE_OUT"]).glob("rank*.json"))]


def test_tiny_sbatch_runs_two_ranks(local_slurm, tiny_slurm_build: Path, tmp_path: Path) -> None:
    env = _env(local_slurm, tmp_path)
    submit_dir = tmp_path / "submit"
    submit_dir.mkdir()

    result = _run(
        ["sbatch", "--wait", "--parsable", str(tiny_slurm_build / SBATCH_SH), str(tiny_slurm_build)], env, submit_dir
    )

    job_id = result.stdout.strip().split(";")[0]
    log = submit_dir / f"slurm-tiny-{job_id}.out"
    assert result.returncode == 0, result.stderr + (log.read_text() if log.exists() else "")
    ranks = _ranks(env)
    assert [r["rank"] for r in ranks] == [0, 1]
    assert {r["world_size"] for r in ranks} == {2}
    assert {r["sum"] for r in ranks} == {3.0}  # (0 + 1) + (1 + 1): both ranks took part
    assert {r["slurm_job_id"] for r in ranks} == {job_id}
    assert all(r["argv"] == [str(tiny_slurm_build.resolve())] for r in ranks)
    assert {r["gloo_socket_ifname"] for r in ranks} == {"lo"}  # nccl.env was sourced
    assert "torchrun.sh: no checkpoint under runs/tiny/checkpoints" in log.read_text()


def test_failing_rank_fails_the_job_through_lmspec_run(local_slurm, tiny_slurm_build: Path, tmp_path: Path) -> None:
    env = _env(local_slurm, tmp_path, ALLREDUCE_FAIL_RANK="1")
    lmspec = Path(sys.executable).with_name("lmspec")

    result = _run([str(lmspec), "run", str(tiny_slurm_build)], env, tmp_path)

    assert result.returncode != 0, result.stdout + result.stderr
    assert "submitted Slurm job" in result.stdout
    assert f"ended with exit code {result.returncode}" in result.stdout
    assert len(_ranks(env)) == 2  # both ranks ran; rank 1 then failed


def test_tiny_training_runs_to_completion_through_lmspec_run(
    local_slurm, tiny_slurm_build: Path, tmp_path: Path
) -> None:
    """The real trainer (lmspec.runtime.train) under `lmspec run` -> sbatch --wait on the local Slurm."""
    env = dict(local_slurm.env, LMSPEC_PYTHON=sys.executable)
    lmspec = Path(sys.executable).with_name("lmspec")

    result = _run([str(lmspec), "run", str(tiny_slurm_build)], env, tmp_path)

    job_id = result.stdout.split("submitted Slurm job ")[1].split(";")[0].split()[0]
    log = tmp_path / f"slurm-tiny-{job_id}.out"
    assert result.returncode == 0, result.stdout + result.stderr + (log.read_text() if log.exists() else "")
    assert f"Slurm job {job_id} ended with exit code 0" in result.stdout
    steps = [json.loads(line)["step"] for line in (tmp_path / "runs/tiny/metrics.jsonl").read_text().splitlines()]
    assert steps[-1] == 30  # train.steps of the cpu-sized tiny spec
    checkpoints = tmp_path / "runs/tiny/checkpoints"
    latest = checkpoints / (checkpoints / "latest").read_text().strip()
    assert sorted(p.name for p in (latest / "trainer_state").iterdir()) == ["rank_0.pt", "rank_1.pt"]  # 2 ranks


def _poll(condition, what: str, timeout_s: float = JOB_TIMEOUT_S) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def _show_job(job_id: str, env: dict[str, str]) -> str:
    return subprocess.run(
        ["scontrol", "show", "job", "--oneliner", job_id], env=env, capture_output=True, text=True, check=False
    ).stdout


def test_pre_timeout_signal_reaches_the_ranks_and_requeues(local_slurm, tiny_slurm_build: Path, tmp_path: Path) -> None:
    """--signal=B:USR1: the batch shell forwards USR1 to the ranks (torchrun survives it), then
    requeues the job, which runs again with SLURM_RESTART_COUNT=1."""
    env = _env(local_slurm, tmp_path, ALLREDUCE_AWAIT_USR1="1")
    out = Path(env["ALLREDUCE_OUT"])
    submitted = _run(["sbatch", "--parsable", str(tiny_slurm_build / SBATCH_SH), str(tiny_slurm_build)], env, tmp_path)
    job_id = submitted.stdout.strip().split(";")[0]
    try:
        _poll(lambda: len(list(out.glob("rank*.ready"))) == 2, "both ranks to start")
        # What Slurm does signal_seconds before the time limit (only to the batch shell: B:)
        subprocess.run(["scancel", "--batch", "--signal=USR1", job_id], env=env, check=True)
        _poll(lambda: "Restarts=1 " in _show_job(job_id, env), "the job to be requeued")
        # Slurm holds a requeued job back (BeginTime, ~2 min) because slurmd revoked the job's credential:
        # a new one issued within the same second still counts as revoked ("Killing non-startable batch
        # job: Job credential revoked"). Release it once the revocation is in the past and the node is idle.
        time.sleep(CREDENTIAL_REVOKE_GRACE_S)

        def released_and_rerun() -> bool:
            node = subprocess.run(
                ["sinfo", "--noheader", "--format=%T"], env=env, capture_output=True, text=True, check=False
            ).stdout.split()
            if node == ["idle"] and "Reason=BeginTime" in _show_job(job_id, env):
                subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], env=env, check=False)
            return len(list(out.glob("rank?.restart1.json"))) == 2

        _poll(released_and_rerun, "the requeued job's ranks")
    finally:
        subprocess.run(["scancel", job_id], env=env, check=False)
    first = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["signal"] for r in first] == ["SIGUSR1", "SIGUSR1"]
    assert [r["torchrun_survived"] for r in first] == [True, True]  # torchrun.sh: trap '' USR1
    log = (tmp_path / f"slurm-tiny-{job_id}.out").read_text()
    assert "requeueing job" in log
    # one console, each run headed by its restart, node-labelled by srun; each run's rank files of their own
    assert f"sbatch.sh: job {job_id} restart 0 on " in log and f"sbatch.sh: job {job_id} restart 1 on " in log
    assert "0: [default0]:allreduce_worker: rank 0 of 2" in log and "rank 1 of 2" not in log
    for restart in (0, 1):
        logs = tmp_path / "runs" / "tiny" / "rank_logs" / f"job{job_id}-restart{restart}"
        assert [p.read_text().strip() for p in sorted(logs.glob("*/attempt_0/*/stdout.log"))] == [
            "allreduce_worker: rank 0 of 2",
            "allreduce_worker: rank 1 of 2",
        ]


def _queued(env: dict[str, str]) -> set[str]:
    listed = subprocess.run(
        ["squeue", "--noheader", "--format=%i"], env=env, capture_output=True, text=True, check=True
    )
    return set(listed.stdout.split())


def test_smoke_asks_slurm_without_submitting(local_slurm, tiny_slurm_build: Path, tmp_path: Path) -> None:
    env = dict(local_slurm.env, LMSPEC_PYTHON=sys.executable)
    before = _queued(env)  # an earlier test's job may still be completing
    result = _run(
        [str(Path(sys.executable).with_name("lmspec")), "run", str(tiny_slurm_build), "--smoke"], env, tmp_path
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "smoke: ok Slurm accepts the job (sbatch --test-only)" in result.stdout
    assert _queued(env) <= before  # nothing was submitted
