"""`lmspec doctor` on what Kubernetes reports of a cluster=kubernetes job (compiler/observe/doctor/kubernetes.py):
the fixes computed from the build, the pod's own stop line read from the emitted k8s/pod.sh run as the kubelet
starts and stops it, and what is not a failure (a save that committed, a server's pod deleted) named as none.
The golden logs of each signature are in tests/logs/test_doctor.py."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers.build import compile_build
from helpers.cli import CliResult
from helpers.k8s_pods import documents, pod_specs, prepare_pod
from helpers.paths import LOG_DATA
from helpers.specs import ON_KUBERNETES

from lmspec.compiler.build.files import K8S_BUILD, K8S_TRAIN
from lmspec.compiler.launchers.kubernetes import GRACE_MARGIN, stop_time

IMAGE = "cluster.kubernetes.image=ghcr.io/my-team/lmspec:0.1"
KILLING = "4m          Normal   Killing   pod/tiny-node-0-0-h7v2k    Stopping container node"  # kubectl get events
FAKE_TRAINER = """#!/bin/bash
# stands in for the image's interpreter: records its pid, then runs until killed
echo $$ > "$FAKE_PID"
sleep 120
"""


def _doctor(lmspec: Callable[..., CliResult], log: Path, *argv: str) -> tuple[int, list[dict]]:
    result = lmspec("doctor", str(log), *argv, "--format", "json")
    assert result.err == "", result.err
    return result.code, json.loads(result.out)


def _fixes(finding: dict) -> dict[str, str]:
    return {fix["key"]: fix["value"] for fix in finding["fixes"]}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return compile_build(tmp_path_factory.mktemp("k8s"), [*ON_KUBERNETES]).dir


def test_the_grace_period_advised_is_the_estimate_of_a_stop_and_half_again(
    lmspec: Callable[..., CliResult], tmp_path: Path
) -> None:
    """A grace period the compile accepts (it covers the estimate) but without the margin: the doctor advises the
    estimate and half again, as the compile's rule does."""
    spec = "llama3_8b_pretrain_8gpu_h100_bf16"
    first = compile_build(tmp_path / "a", [*ON_KUBERNETES], spec=spec).plan
    stop = stop_time(first.trained().spec)
    assert stop is not None and stop.total_s > 10
    grace = math.ceil(stop.total_s)
    build = compile_build(
        tmp_path / "b",
        [*ON_KUBERNETES, f"cluster.kubernetes.termination_grace_seconds={grace}"],
        spec=spec,
    ).dir
    code, findings = _doctor(lmspec, LOG_DATA / "k8s_stopped_mid_save.log", "--build", str(build))
    assert code == 1 and [f["signature"] for f in findings] == ["k8s_stopped_mid_save"]
    fixes = _fixes(findings[0])
    assert fixes["cluster.kubernetes.termination_grace_seconds"] == str(math.ceil(stop.total_s * GRACE_MARGIN))
    assert f"grace period: {grace} s" in findings[0]["cause"]


def test_a_grace_period_the_estimate_fits_names_the_storage_rate(lmspec: Callable[..., CliResult], tiny: Path) -> None:
    """The tiny model's stop takes well under a second of the default 900: the save was slower than priced."""
    findings = _doctor(lmspec, LOG_DATA / "k8s_stopped_mid_save.log", "--build", str(tiny))[1]
    fixes = _fixes(findings[0])
    assert fixes["cluster.kubernetes.termination_grace_seconds"] == "<longer than 900>"
    assert fixes["cluster.storage_write_gb_per_s"] == "<what the pods' volume sustains, now 10>"


def test_oom_with_the_build_names_its_memory_and_the_checkpoint_staging(
    lmspec: Callable[..., CliResult], tmp_path: Path
) -> None:
    build = compile_build(tmp_path, [*ON_KUBERNETES, "cluster.kubernetes.memory=512Gi"]).dir
    finding = _doctor(lmspec, LOG_DATA / "k8s_oom_killed.log", "--build", str(build))[1][0]
    assert finding["signature"] == "k8s_oom_killed"
    assert _fixes(finding)["cluster.kubernetes.memory"] == "<more than 512Gi, up to a node's allocatable memory>"
    assert "A checkpoint save stages " in finding["cause"] and "(64 GiB)" in finding["cause"]
    assert "parallel.offload_optimizer" not in _fixes(finding)  # the tiny model offloads nothing


def test_a_save_committed_after_the_stop_is_no_failure_of_the_grace_period(
    lmspec: Callable[..., CliResult], tmp_path: Path, tiny: Path
) -> None:
    text = (LOG_DATA / "k8s_stopped_mid_save.log").read_text().splitlines()
    stop = next(i for i, line in enumerate(text) if line.startswith("pod.sh: SIGTERM"))
    saved = "[default0]:lmspec: SIGUSR1 received: checkpointed at step 2004; exit 3 (requeue)"
    log = tmp_path / "saved.log"
    log.write_text("\n".join([*text[: stop + 2], saved, *text[stop + 2 :]]) + "\n")
    signatures = [f["signature"] for f in _doctor(lmspec, log)[1]]
    assert "k8s_stopped_mid_save" not in signatures and "k8s_oom_killed" not in signatures
    assert signatures == ["stopped_for_requeue"]
    # with the Kubernetes build, the stop names no Slurm key: nothing of Slurm's would have stopped it
    (finding,) = _doctor(lmspec, log, "--build", str(tiny))[1]
    assert finding["signature"] == "stopped_for_requeue" and not any("slurm" in key for key in _fixes(finding))


def test_a_server_pod_deleted_is_no_failure(lmspec: Callable[..., CliResult], tmp_path: Path) -> None:
    """A serving pod stopped by its deletion: pod.sh sends vLLM TERM, the kubelet's Killing event; no save."""
    log = tmp_path / "serve.log"
    log.write_text(
        "pod.sh: SIGTERM: sending TERM to the serve-leader processes\n"
        "LAST SEEN   TYPE     REASON    OBJECT          MESSAGE\n"
        "2m          Normal   Killing   pod/tiny-0      Stopping container serve\n"
    )
    assert _doctor(lmspec, log) == (0, [])


def test_the_emitted_pod_script_stopped_by_the_kubelet_is_read_as_stopped_mid_save(
    lmspec: Callable[..., CliResult], tiny: Path, tmp_path: Path
) -> None:
    """k8s/pod.sh of the TrainJob's pod, started as the kubelet starts it (its mounts at local folders, Trainer's
    PET_* injected) over a trainer that never saves, gets the kubelet's SIGTERM, then, the grace period over,
    SIGKILL: its console and the Killing event are what the doctor reads."""
    objects = documents(tiny / K8S_BUILD) + documents(tiny / K8S_TRAIN)
    pod_spec = next(spec for obj in objects for spec in pod_specs(obj))
    mount, work = tmp_path / "mount", tmp_path / "work"
    mount.mkdir()
    work.mkdir()
    fake = tmp_path / "fake-python"
    fake.write_text(FAKE_TRAINER)
    fake.chmod(0o755)
    injected = {
        "PET_NNODES": "1",
        "PET_NPROC_PER_NODE": "2",
        "PET_NODE_RANK": "0",
        "PET_MASTER_ADDR": "127.0.0.1",
        "PET_MASTER_PORT": "29500",
        "LMSPEC_PYTHON": str(fake),
        "FAKE_PID": str(tmp_path / "pid"),
        "TMPDIR": str(tmp_path),
        "PATH": os.environ["PATH"],
    }
    pod = prepare_pod(objects, pod_spec, {"/lmspec/build": mount, "/workspace": work}, injected)
    console = tmp_path / "console.log"
    with open(console, "wb") as out:
        proc = subprocess.Popen(
            pod.argv, env=pod.env, cwd=pod.cwd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        _wait_for(lambda: (tmp_path / "pid").is_file() and bool((tmp_path / "pid").read_text().strip()), proc)
        proc.send_signal(signal.SIGTERM)  # the kubelet's, to the container's first process
        _wait_for(lambda: "pod.sh: SIGTERM" in console.read_text(), proc)
    finally:  # the grace period over: SIGKILL to everything the container started
        trainer = int((tmp_path / "pid").read_text()) if (tmp_path / "pid").is_file() else None
        for group in {proc.pid, *([os.getpgid(trainer)] if trainer and _alive(trainer) else [])}:
            try:
                os.killpg(group, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait(timeout=30)
    log = tmp_path / "pod.log"
    log.write_text(console.read_text() + "LAST SEEN   TYPE     REASON    OBJECT    MESSAGE\n" + KILLING + "\n")
    code, findings = _doctor(lmspec, log, "--build", str(tiny))
    assert code == 1 and [f["signature"] for f in findings] == ["k8s_stopped_mid_save"], log.read_text()
    evidence = [e["text"] for e in findings[0]["evidence"]]
    assert "pod.sh: SIGTERM: sending USR1 to the train processes" in evidence
    assert any("Stopping container node" in e for e in evidence)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _wait_for(ready: Callable[[], bool], proc: subprocess.Popen[bytes], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        assert proc.poll() is None or ready(), f"pod.sh exited with {proc.returncode} first"
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_stop_ended_by_the_oom_killer_is_out_of_memory_not_the_grace_period(
    lmspec: Callable[..., CliResult], tmp_path: Path
) -> None:
    """SIGTERM came, and the save ran the pod out of memory: the kernel's SIGKILL, not the kubelet's."""
    log = tmp_path / "oom-during-save.log"
    status = "    Last State:     Terminated\n      Reason:       OOMKilled\n      Exit Code:    137\n"
    log.write_text((LOG_DATA / "k8s_stopped_mid_save.log").read_text() + status)
    assert [f["signature"] for f in _doctor(lmspec, log)[1]] == ["k8s_oom_killed"]


def test_a_missing_tag_names_the_image_first(lmspec: Callable[..., CliResult], tmp_path: Path) -> None:
    log = tmp_path / "events.log"
    log.write_text(
        "LAST SEEN   TYPE      REASON   OBJECT                       MESSAGE\n"
        "2m          Warning   Failed   pod/tiny-node-0-0-x8k2d      "
        'Failed to pull image "ghcr.io/my-team/lmspec:0.2": '
        'failed to pull and unpack image "ghcr.io/my-team/lmspec:0.2": failed to resolve reference '
        '"ghcr.io/my-team/lmspec:0.2": ghcr.io/my-team/lmspec:0.2: not found\n'
    )
    finding = _doctor(lmspec, log)[1][0]
    assert finding["signature"] == "k8s_image_pull"
    assert [f["key"] for f in finding["fixes"]] == ["cluster.kubernetes.image", "cluster.kubernetes.image_pull_secrets"]
    assert "ghcr.io/my-team/lmspec:0.2" in finding["cause"]


def test_the_specs_gpu_resource_is_the_one_short(lmspec: Callable[..., CliResult], tmp_path: Path) -> None:
    """With the build, the resource the scheduler found short is matched to the spec's own: AMD GPUs here."""
    build = compile_build(tmp_path, [*ON_KUBERNETES, "cluster.kubernetes.gpu_resource=amd.com/gpu"]).dir
    log = tmp_path / "events.log"
    log.write_text(
        "LAST SEEN   TYPE      REASON             OBJECT                      MESSAGE\n"
        "1m          Warning   FailedScheduling   pod/tiny-node-0-0-tq8wm     0/3 nodes are available: "
        "3 Insufficient amd.com/gpu. preemption: 0/3 nodes are available: 3 No preemption victims found for "
        "incoming pod.\n"
    )
    fixes = _fixes(_doctor(lmspec, log, "--build", str(build))[1][0])
    assert fixes["hardware.gpus_per_node"] == "<at most a node's amd.com/gpu> (now 2)"
    assert fixes["cluster.kubernetes.gpu_resource"].endswith("(now amd.com/gpu)")
