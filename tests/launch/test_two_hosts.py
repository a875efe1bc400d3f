"""Two hosts for real: two network namespaces on this machine, each a node with its own address on
the interface the spec names (hardware.inter_node.socket_ifname), joined by a bridge. `lmspec run`
of one 2-node build on each (NODE_RANK, MASTER_ADDR = node 0's address) trains the tiny model across
them through the emitted launch/torchrun.sh, gloo bound to that interface; then the faults between
hosts: a node that dies, a cable pulled, an interface that does not exist.

The file system is shared between the namespaces, as a cluster's is: both nodes write runs/ in one
working directory. Needs root and iproute2 (tests/helpers/netns.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers.build import compile_build
from helpers.netns import IFNAME, Host, hosts, netns_missing_reason
from helpers.torchrun import Run, one_node_reference

from lmspec.runtime.train.checkpoint import verify

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(netns_missing_reason() is not None, reason=str(netns_missing_reason())),
]

NAME = "twohosts"
PORT = 29400  # each namespace has its own ports: no other job can hold this one there
TIMEOUT_MINUTES = 1  # cluster.nccl.timeout_minutes: the collective timeout gloo waits on a silent peer
RUN_TIMEOUT_S = 300
# tiny at DP=2 (one rank per node): 8 steps, a checkpoint every 2, a metrics line every step.
TRAIN = [f"name={NAME}", "train.steps=8", "train.checkpoint.interval=2", "train.log_interval=1"]
TWO_NODES = [
    "hardware.nodes=2",
    "hardware.gpus_per_node=1",
    f"hardware.inter_node.socket_ifname={IFNAME}",
    f"cluster.nccl.timeout_minutes={TIMEOUT_MINUTES}",
]
LMSPEC = Path(sys.executable).parent / "lmspec"


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """The same training on one node, two ranks over loopback: what the two hosts must reproduce."""
    return one_node_reference(tmp_path_factory.mktemp("reference"), TRAIN)


@pytest.fixture(scope="module")
def two_node_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return compile_build(tmp_path_factory.mktemp("build"), [*TRAIN, *TWO_NODES]).dir


def node_commands(build: Path) -> list[str]:
    """The per-node commands `lmspec run` prints for a multi-node build on cluster.launcher=local."""
    env = {k: v for k, v in os.environ.items() if k not in ("NODE_RANK", "MASTER_ADDR", "MASTER_PORT")}
    printed = subprocess.run([str(LMSPEC), "run", str(build)], env=env, capture_output=True, text=True, timeout=120)
    assert printed.returncode == 0 and "lmspec starts no node for it here" in printed.stdout, printed.stderr
    commands = re.findall(r"^  node (\d+): (.+)$", printed.stdout, re.M)
    assert [int(node) for node, _ in commands] == [0, 1]
    return [command for _, command in commands]


def start_node(host: Host, rank: int, node0: Host, build: Path, cwd: Path) -> tuple[subprocess.Popen, Path]:
    """Node `rank`'s printed command on `host`, with node 0's address and a port filled in."""
    command = re.sub(r"=ADDRESS\b", f"={node0.address}", node_commands(build)[rank])
    command = re.sub(r"=PORT\b", f"={PORT}", command)
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    log = cwd / f"node{rank}-{time.monotonic_ns()}.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            host.command(["bash", "-c", command]), cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT
        )
    return proc, log


def run_nodes(
    nodes: list[Host],
    build: Path,
    cwd: Path,
    when: Callable[[], bool] | None = None,
    fault: Callable[[], None] | None = None,
    awaited: tuple[int, ...] = (0, 1),
) -> tuple[list[Run], float]:
    """The `awaited` nodes to their end (with `fault()` once `when()` holds), the others then killed; the runs,
    and seconds from the fault to the last awaited exit."""
    started = [start_node(host, rank, nodes[0], build, cwd) for rank, host in enumerate(nodes)]
    deadline, faulted = time.monotonic() + RUN_TIMEOUT_S, None
    while any(started[rank][0].poll() is None for rank in awaited):
        if time.monotonic() > deadline:
            logs = "\n".join(log.read_text()[-3000:] for _, log in started)
            raise AssertionError(f"the nodes did not finish in {RUN_TIMEOUT_S} s:\n{logs}")
        if fault is not None and faulted is None and when is not None and when():
            fault()
            faulted = time.monotonic()
        time.sleep(0.05)
    ended = time.monotonic()
    for host, (proc, _) in zip(nodes, started, strict=True):
        if proc.poll() is None:
            host.kill_all()
            proc.wait(timeout=30)
    runs = [Run(proc.returncode, log.read_text(), cwd) for proc, log in started]
    return runs, ended - faulted if faulted is not None else 0.0


def _steps_done(cwd: Path, count: int) -> Callable[[], bool]:
    metrics = cwd / "runs" / NAME / "metrics.jsonl"
    latest = cwd / "runs" / NAME / "checkpoints" / "latest"
    return lambda: latest.is_file() and metrics.is_file() and len(metrics.read_text().splitlines()) >= count


def test_two_hosts_train_and_checkpoint_as_one_node_does(two_node_build: Path, reference: Run, tmp_path: Path) -> None:
    with hosts(2, "t") as nodes:
        runs, _ = run_nodes(nodes, two_node_build, tmp_path)
    assert [r.code for r in runs] == [0, 0], "\n".join(r.output[-3000:] for r in runs)
    assert "torchrun.sh: no checkpoint under" in runs[0].output
    losses = runs[0].losses(NAME)
    assert sorted(losses) == list(range(1, 9))
    assert losses == reference.losses(NAME)  # bitwise: the same floats as two ranks on one node
    checkpoints = tmp_path / "runs" / NAME / "checkpoints"
    assert (checkpoints / "latest").read_text().strip() == "step_8" and verify(checkpoints / "step_8") is None


def test_a_dead_node_ends_the_other_then_both_resume(
    two_node_build: Path, reference: Run, tmp_path: Path, lmspec
) -> None:
    with hosts(2, "k") as nodes:
        runs, seconds = run_nodes(nodes, two_node_build, tmp_path, _steps_done(tmp_path, 3), nodes[1].kill_all)
        assert runs[0].code != 0 and runs[1].code != 0
        assert seconds < TIMEOUT_MINUTES * 60 + 60, f"node 0 took {seconds:.0f} s to give up"
        log = tmp_path / "node0-dead-peer.log"
        log.write_text(runs[0].output)
        doctor = lmspec("doctor", str(log), "--build", str(two_node_build))
        assert doctor.code == 1, doctor.out + doctor.err
        assert "[nccl_connection]" in doctor.out and "Connection closed by peer" in doctor.out, doctor.out
        assert "hardware.inter_node.socket_ifname" in doctor.out
        latest = (tmp_path / "runs" / NAME / "checkpoints" / "latest").read_text().strip()
        resumed, _ = run_nodes(nodes, two_node_build, tmp_path)
    assert [r.code for r in resumed] == [0, 0], "\n".join(r.output[-3000:] for r in resumed)
    step = int(latest.removeprefix("step_"))
    assert f"resumed from runs/{NAME}/checkpoints/{latest} (step {step})" in resumed[0].output
    losses, ref = resumed[0].losses(NAME), reference.losses(NAME)
    assert all(losses[s] == ref[s] for s in range(step + 1, 9))


def test_a_pulled_cable_times_out_and_doctor_names_the_keys(two_node_build: Path, tmp_path: Path, lmspec) -> None:
    """Node 1's cable pulled: both sides' collectives time out after cluster.nccl.timeout_minutes and node 0
    exits. Node 1's torchrun agent then waits on the rendezvous store it can no longer reach (torch's own
    rendezvous timeouts; under Slurm, srun ends the step when node 0's task fails), so it is killed here."""
    with hosts(2, "u") as nodes:
        unplug = nodes[1].unplug
        runs, seconds = run_nodes(nodes, two_node_build, tmp_path, _steps_done(tmp_path, 3), unplug, awaited=(0,))
    assert runs[0].code != 0
    timed_out = f"Timed out waiting {TIMEOUT_MINUTES * 60000}ms"
    assert timed_out in runs[0].output  # node 0's console: global rank 0
    rank_files = sorted((tmp_path / "runs" / NAME / "rank_logs").glob("*/*/attempt_0/*/stderr.log"))
    assert len(rank_files) == 2 and all(timed_out in f.read_text() for f in rank_files)  # each rank, both nodes
    assert TIMEOUT_MINUTES * 60 - 5 < seconds < TIMEOUT_MINUTES * 60 + 90, f"{seconds:.0f} s from the cable pulled"
    log = tmp_path / "node0.log"
    log.write_text(runs[0].output)
    doctor = lmspec("doctor", str(log), "--build", str(two_node_build))
    assert doctor.code == 1, doctor.out + doctor.err
    assert "cluster.nccl.timeout_minutes" in doctor.out and "hardware.inter_node.socket_ifname" in doctor.out


def test_run_prints_each_nodes_command_and_starts_nothing(two_node_build: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    commands = node_commands(two_node_build)
    assert not (tmp_path / "runs").exists()
    for rank, command in enumerate(commands):
        assert f"NODE_RANK={rank} MASTER_ADDR=ADDRESS MASTER_PORT=PORT " in command
        assert command.endswith(f"{LMSPEC} run {two_node_build.resolve()}")
        assert f"LMSPEC_PYTHON={sys.executable}" in command


def test_an_interface_the_node_lacks_is_named_before_the_rendezvous(tmp_path: Path) -> None:
    build = compile_build(tmp_path / "build", [*TRAIN, *TWO_NODES, "hardware.inter_node.socket_ifname=ib7"]).dir
    with hosts(1, "i") as nodes:
        proc, log = start_node(nodes[0], 0, nodes[0], build, tmp_path)
        assert proc.wait(timeout=120) == 2
    assert "no network interface ib7" in log.read_text()
    assert "hardware.inter_node.socket_ifname=ib7" in log.read_text() and IFNAME in log.read_text()
    doctor = subprocess.run(
        [str(LMSPEC), "doctor", str(log), "--build", str(build)], capture_output=True, text=True, timeout=120
    )
    assert doctor.returncode == 1, doctor.stdout + doctor.stderr
    assert "launch/torchrun.sh found no interface ib7" in doctor.stdout
    assert "hardware.inter_node.socket_ifname=" in doctor.stdout
