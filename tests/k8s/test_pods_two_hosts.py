"""The emitted training pods, run as their controller would start them, on two hosts named as its DNS names them.

Two network namespaces (tests/helpers/netns.py) are the two nodes' pods: each resolves `<name>-node-0-0.<name>`
and `<name>-node-0-1.<name>` (what JobSet's `network.enableDNSHostnames` gives, and what Kubeflow Trainer puts in
PET_MASTER_ADDR) to the pod's address. Each runs the container command of k8s/train.yaml with the environment the
controller injects (Trainer's PET_*; the Indexed Job's JOB_COMPLETION_INDEX), the build ConfigMaps of
k8s/build.yaml mounted as the kubelet mounts them, and one shared folder as the ReadWriteMany volume
(tests/helpers/k8s_pods.py). The losses must be those of two ranks on one node, bitwise. Then the kubelet's
SIGTERM to both pods mid-run: the trainer saves and the pods end; the pods started again (what the JobSet's
restart does) resume and finish with the same losses.

The image's interpreter is this one (LMSPEC_PYTHON, which launch/torchrun.sh reads). Needs root and iproute2.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from helpers.build import compile_build
from helpers.k8s_pods import Pod, documents, pod_specs, prepare_pod
from helpers.netns import IFNAME, Host, hosts, netns_missing_reason
from helpers.torchrun import Run, one_node_reference

from lmspec.compiler.build.files import K8S_BUILD, K8S_TRAIN
from lmspec.runtime.train.checkpoint import verify

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(netns_missing_reason() is not None, reason=str(netns_missing_reason())),
]

NAME = "k8spods"
NODES = 2
TRAINER_PORT = (
    "29500"  # PET_MASTER_PORT: the rendezvous port Trainer's torch plugin injects (each namespace has its own)
)
RUN_TIMEOUT_S = 300
TRAIN = [f"name={NAME}", "train.steps=8", "train.checkpoint.interval=2", "train.log_interval=1"]
TWO_PODS = [
    "cluster=kubernetes",
    "cluster.kubernetes.image=ghcr.io/example/lmspec:test",
    "serve=null",
    f"hardware.nodes={NODES}",
    "hardware.gpus_per_node=1",
    f"hardware.inter_node.socket_ifname={IFNAME}",
    "cluster.nccl.timeout_minutes=1",
]


def pod_names(name: str) -> list[list[str]]:
    """Pod i of replicated job `node`: hostname `<name>-node-0-i` in the JobSet's headless service `<name>`."""
    return [[f"{name}-node-0-{i}.{name}", f"{name}-node-0-{i}"] for i in range(NODES)]


def injected(flavor: str, rank: int) -> dict[str, str]:
    """What the controller sets in the container beyond the manifest's env (Trainer's torch plugin; Job's index)."""
    if flavor == "trainjob":
        return {
            "PET_NNODES": str(NODES),
            "PET_NPROC_PER_NODE": "1",
            "PET_NODE_RANK": str(rank),
            "PET_MASTER_ADDR": pod_names(NAME)[0][0],
            "PET_MASTER_PORT": TRAINER_PORT,
        }
    return {"JOB_COMPLETION_INDEX": str(rank)}


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Run:
    return one_node_reference(tmp_path_factory.mktemp("reference"), TRAIN)


def training_pod(objects: list[dict[str, Any]]) -> dict[str, Any]:
    """The pod template whose container runs pod.sh (the runtime's template for a TrainJob, the JobSet's own)."""
    (pod,) = [p for o in objects for p in pod_specs(o)]
    return pod


def start_pods(
    build: Path, flavor: str, nodes: list[Host], root: Path, attempt: int
) -> list[tuple[subprocess.Popen, Path]]:
    objects = documents(build / K8S_TRAIN) + documents(build / K8S_BUILD)
    pod = training_pod(objects)
    (container,) = pod["containers"]
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    k8s = compile_spec_paths(objects)
    work = root / "volume"  # the ReadWriteMany claim every pod mounts at work_dir
    work.mkdir(exist_ok=True)
    started = []
    for rank, host in enumerate(nodes):
        mount = root / f"pod{rank}-attempt{attempt}-build"
        mount.mkdir()
        ready: Pod = prepare_pod(
            objects,
            pod,
            {k8s["build_dir"]: mount, k8s["work_dir"]: work},
            {
                **injected(flavor, rank),
                "PATH": os.environ["PATH"],
                "HOME": os.environ.get("HOME", "/root"),
                "LMSPEC_PYTHON": sys.executable,
                "PYTHONUNBUFFERED": "1",
                "OMP_NUM_THREADS": "1",
            },
        )
        assert set(mounts) >= {k8s["build_dir"], k8s["work_dir"]}
        log = root / f"pod{rank}-attempt{attempt}.log"
        with log.open("w") as out:
            proc = subprocess.Popen(
                host.command(ready.argv), cwd=ready.cwd, env=ready.env, stdout=out, stderr=subprocess.STDOUT
            )
        started.append((proc, log))
    return started


def compile_spec_paths(objects: list[dict[str, Any]]) -> dict[str, str]:
    """The build and work mount paths the pod template declares (cluster.kubernetes.build_dir, work_dir)."""
    pod = training_pod(objects)
    (container,) = pod["containers"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    paths = {}
    for mount in container["volumeMounts"]:
        volume = volumes[mount["name"]]
        if "configMap" in volume or "projected" in volume:
            paths["build_dir"] = mount["mountPath"]
        elif mount["mountPath"] == container["workingDir"]:
            paths["work_dir"] = mount["mountPath"]
    return paths


def wait_all(
    nodes: list[Host], started: list[tuple[subprocess.Popen, Path]], stop_when: Path | None = None
) -> list[Run]:
    """Every pod to its end; with `stop_when`, the kubelet's SIGTERM to every pod's command once that file exists."""
    deadline, stopped = time.monotonic() + RUN_TIMEOUT_S, False
    while any(proc.poll() is None for proc, _ in started):
        if time.monotonic() > deadline:
            for host in nodes:
                host.kill_all()
            raise AssertionError(
                "the pods did not finish:\n" + "\n".join(log.read_text()[-3000:] for _, log in started)
            )
        if stop_when is not None and not stopped and stop_when.is_file():
            for proc, _ in started:
                proc.send_signal(signal.SIGTERM)  # `ip netns exec` execs: proc is the container's PID 1, pod.sh
            stopped = True
        time.sleep(0.05)
    return [Run(proc.returncode, log.read_text(), Path(log).parent / "volume") for proc, log in started]


@pytest.mark.parametrize("flavor", ["trainjob", "jobset"])
def test_the_pods_train_as_one_node_does(flavor: str, reference: Run, tmp_path: Path) -> None:
    build = compile_build(tmp_path / "build", [*TRAIN, *TWO_PODS, f"cluster.kubernetes.flavor={flavor}"]).dir
    with hosts(NODES, flavor[:2], names=pod_names(NAME)) as nodes:
        runs = wait_all(nodes, start_pods(build, flavor, nodes, tmp_path, 0))
    assert [r.code for r in runs] == [0, 0], "\n".join(r.output[-3000:] for r in runs)
    assert runs[0].losses(NAME) == reference.losses(NAME)  # bitwise: two ranks on one node
    checkpoints = tmp_path / "volume" / "runs" / NAME / "checkpoints"
    assert (checkpoints / "latest").read_text().strip() == "step_8" and verify(checkpoints / "step_8") is None


def test_sigterm_saves_and_the_restarted_pods_resume(reference: Run, tmp_path: Path) -> None:
    build = compile_build(tmp_path / "build", [*TRAIN, *TWO_PODS, "cluster.kubernetes.flavor=jobset"]).dir
    checkpoints = tmp_path / "volume" / "runs" / NAME / "checkpoints"
    with hosts(NODES, "st", names=pod_names(NAME)) as nodes:
        stopped = wait_all(nodes, start_pods(build, "jobset", nodes, tmp_path, 0), stop_when=checkpoints / "latest")
        assert all("SIGTERM" in r.output for r in stopped), "\n".join(r.output[-3000:] for r in stopped)
        # the trainer exits 3 (stopped, resumable); torchrun reports any rank's non-zero exit as its own 1
        assert all(r.code != 0 for r in stopped) and "checkpointed at step" in stopped[0].output, stopped[0].output
        latest = (checkpoints / "latest").read_text().strip()
        step = int(latest.removeprefix("step_"))
        assert step < 8 and verify(checkpoints / latest) is None
        resumed = wait_all(nodes, start_pods(build, "jobset", nodes, tmp_path, 1))
    assert [r.code for r in resumed] == [0, 0], "\n".join(r.output[-3000:] for r in resumed)
    assert f"resumed from runs/{NAME}/checkpoints/{latest} (step {step})" in resumed[0].output
    losses, ref = resumed[0].losses(NAME), reference.losses(NAME)
    assert all(losses[s] == ref[s] for s in range(step + 1, 9))
