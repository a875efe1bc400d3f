"""Two-node Slurm for real: one slurmctld and a slurmd per network-namespace host (helpers.slurm.NamespaceSlurm),
each slurmd its own NodeName at its host's address. The emitted launch/sbatch.sh of a 2-node build trains the
tiny model across both (srun starts torchrun.sh on each, MASTER_ADDR = the first node's name, gloo on the
interface the spec names) with the losses of the same training on one node; then Slurm's pre-timeout USR1:
the batch shell asks the trainer to checkpoint, requeues the job, and the second run resumes from that
checkpoint and finishes, its rank logs apart from the first run's."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from helpers.build import compile_build
from helpers.netns import IFNAME, Host, hosts, netns_missing_reason
from helpers.slurm import NamespaceSlurm, slurm_missing_reason
from helpers.torchrun import Run, one_node_reference

from lmspec.compiler.build.files import SBATCH_SH
from lmspec.runtime.train.checkpoint import verify

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(netns_missing_reason() is not None, reason=str(netns_missing_reason())),
    pytest.mark.skipif(slurm_missing_reason() is not None, reason=str(slurm_missing_reason())),
]

NAME = "slurm2"
STEPS = 8
JOB_TIMEOUT_S = 300
CREDENTIAL_REVOKE_GRACE_S = 2.0  # see test_slurm.py: a requeued job's new credential must postdate the revoked one
TRAIN = [f"name={NAME}", f"train.steps={STEPS}", "train.checkpoint.interval=2", "train.log_interval=1"]
TWO_NODES = [
    "cluster=slurm",
    "hardware.nodes=2",
    "hardware.gpus_per_node=1",
    f"hardware.inter_node.socket_ifname={IFNAME}",
    "cluster.nccl.timeout_minutes=1",
    "cluster.slurm.cpus_per_task=1",
]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[NamespaceSlurm, list[Host]]]:
    with hosts(2, "q") as nodes:
        slurm = NamespaceSlurm(tmp_path_factory.mktemp("slurm2"), nodes)
        slurm.start()
        try:
            yield slurm, nodes
        finally:
            subprocess.run(slurm.client(["scancel", "--user=root"]), env=slurm.env, check=False)
            slurm.stop()


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """The same training on one node, two ranks over loopback."""
    return one_node_reference(tmp_path_factory.mktemp("reference"), TRAIN)


def _client(slurm: NamespaceSlurm, argv: list[str], cwd: Path, timeout_s: float = 60) -> str:
    done = subprocess.run(
        slurm.client(argv), cwd=cwd, env=_env(slurm), capture_output=True, text=True, timeout=timeout_s, check=True
    )
    return done.stdout


def _env(slurm: NamespaceSlurm) -> dict[str, str]:
    return dict(slurm.env, LMSPEC_PYTHON=sys.executable, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")


def _poll(condition: Callable[[], bool], what: str, timeout_s: float = JOB_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.5)


def _job(slurm: NamespaceSlurm, job_id: str, cwd: Path) -> str:
    return _client(slurm, ["scontrol", "show", "job", job_id], cwd)


def test_sbatch_trains_across_two_slurm_nodes_as_one_node_does(cluster, reference: Run, tmp_path: Path) -> None:
    slurm, _ = cluster
    build = compile_build(tmp_path / "build", [*TRAIN, *TWO_NODES]).dir
    submitted = subprocess.run(
        slurm.client(["sbatch", "--wait", "--parsable", str(build / SBATCH_SH), str(build)]),
        cwd=tmp_path,
        env=_env(slurm),
        capture_output=True,
        text=True,
        timeout=JOB_TIMEOUT_S,
        check=False,
    )
    job_id = submitted.stdout.strip().split(";")[0]
    log = (tmp_path / f"slurm-{NAME}-{job_id}.out").read_text()
    assert submitted.returncode == 0, log[-4000:]
    assert "0: [default0]:" in log and "1: [default0]" not in log  # srun labels; rank 0's console only
    finished = Run(0, log, tmp_path)
    assert finished.losses(NAME) == reference.losses(NAME)  # bitwise, across two Slurm nodes
    checkpoints = tmp_path / "runs" / NAME / "checkpoints"
    assert (checkpoints / "latest").read_text().strip() == f"step_{STEPS}" and verify(
        checkpoints / f"step_{STEPS}"
    ) is None
    rank_logs = sorted((tmp_path / "runs" / NAME / "rank_logs" / f"job{job_id}-restart0").glob("*/attempt_0/*"))
    assert len(rank_logs) == 2  # one rank per node, each its own files


def test_pre_timeout_signal_checkpoints_requeues_and_resumes(cluster, tmp_path: Path, lmspec) -> None:
    """Slurm's --signal=B:USR1 (sent here by scancel --batch, as Slurm does signal_seconds before the limit):
    the batch shell forwards USR1, the trainer checkpoints and exits, the job is requeued, and the requeued
    run resumes from that checkpoint on both nodes and trains to the last step. Checkpoints before the
    signal start megatron-core's save helper, which Slurm's USR1 reaches too (it must survive it); the doctor
    reads the log as a stop for requeue, not a crash."""
    slurm, _ = cluster
    steps = 60  # far more than run before the signal
    build = compile_build(
        tmp_path / "build", [*TRAIN, *TWO_NODES, f"train.steps={steps}", "train.checkpoint.interval=2"]
    ).dir
    job_id = (
        _client(slurm, ["sbatch", "--parsable", str(build / SBATCH_SH), str(build)], tmp_path).strip().split(";")[0]
    )
    metrics = tmp_path / "runs" / NAME / "metrics.jsonl"
    checkpoints = tmp_path / "runs" / NAME / "checkpoints"
    try:
        _poll(lambda: metrics.is_file() and len(metrics.read_text().splitlines()) >= 3, "three steps")
        subprocess.run(slurm.client(["scancel", "--batch", "--signal=USR1", job_id]), env=slurm.env, check=True)
        _poll(lambda: "Restarts=1 " in _job(slurm, job_id, tmp_path), "the job to be requeued")
        saved = (checkpoints / "latest").read_text().strip()
        time.sleep(CREDENTIAL_REVOKE_GRACE_S)

        def released_and_done() -> bool:
            state = _job(slurm, job_id, tmp_path)
            if "Reason=BeginTime" in state:
                subprocess.run(
                    slurm.client(["scontrol", "update", f"JobId={job_id}", "StartTime=now"]), env=slurm.env, check=False
                )
            return "JobState=COMPLETED" in state or "JobState=FAILED" in state

        _poll(released_and_done, "the requeued run to finish", timeout_s=JOB_TIMEOUT_S * 2)
    finally:
        subprocess.run(slurm.client(["scancel", job_id]), env=slurm.env, check=False)
    log = (tmp_path / f"slurm-{NAME}-{job_id}.out").read_text()
    assert "JobState=COMPLETED" in _job(slurm, job_id, tmp_path), log[-4000:]
    assert "asking the trainer to checkpoint (SIGUSR1)" in log and f"requeueing job {job_id}" in log
    assert f"sbatch.sh: job {job_id} restart 1 on " in log
    saved_step = int(saved.removeprefix("step_"))
    assert 0 < saved_step < steps  # the checkpoint the signal asked for, mid-run
    assert f"resumed from runs/{NAME}/checkpoints/{saved} (step {saved_step})" in log
    assert (checkpoints / "latest").read_text().strip() == f"step_{steps}"
    doctor = lmspec("doctor", str(tmp_path / f"slurm-{NAME}-{job_id}.out"), "--build", str(build))
    assert "[stopped_for_requeue]" in doctor.out and f"checkpointed at step {saved_step}" in doctor.out, doctor.out
    for restart in (0, 1):
        assert (
            len(list((tmp_path / "runs" / NAME / "rank_logs" / f"job{job_id}-restart{restart}").glob("*/attempt_0/*")))
            == 2
        )
