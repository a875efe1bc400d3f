"""cluster=kubernetes at compile time, without a cluster: its rules refuse what the API server, the controllers or
the pods would (each naming the key and a fix), pod.sh passes shellcheck, the build ConfigMaps carry every file
the pods read byte for byte in ConfigMaps under 1 MiB, and the job files hold the objects each flavor names,
every container running pod.sh in its role. The CRD schemas and CEL rules judge the objects in tests/k8s/."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers.k8s_pods import pod_specs, walk
from helpers.k8s_schema import documents

from lmspec.compiler.build.files import K8S_BUILD, K8S_POD_SH, K8S_SERVE, K8S_TRAIN, MANIFEST
from lmspec.compiler.build.writer import stale_files, write_build
from lmspec.compiler.emit.manifest import build_files
from lmspec.compiler.errors import UsageError
from lmspec.compiler.launchers.k8s import build_config
from lmspec.compiler.launchers.k8s.build_config import CONFIG_MAP_BYTES, config_key, pod_files, split
from lmspec.compiler.launchers.k8s.yaml_text import dump_objects
from lmspec.compiler.launchers.kubernetes import stop_time
from lmspec.compiler.pipeline import make_plan
from lmspec.compiler.plan import Plan

K8S = ["cluster=kubernetes", "cluster.kubernetes.image=ghcr.io/example/lmspec:1"]
TRAIN_SPEC = "deepseek_v2_lite_pretrain_32gpu_h100_k8s"
SERVE_SPEC = "llama3_70b_serve_16gpu_h100_k8s"
SERVES = ["serve.host=0.0.0.0", "serve.api_key_env=null"]


def compiled(overrides: list[str], spec: str | None = None) -> tuple[Plan, dict[str, str]]:
    plan = make_plan(overrides, Path(spec) if spec else None)
    return plan, build_files(plan)


def containers(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [c for obj in objects for pod in pod_specs(obj) for c in pod["containers"]]


ERRORS = [
    pytest.param(
        ["cluster=kubernetes"],
        ["cluster.kubernetes.image=null (lmspec:specs/cluster/local.yaml:", "set cluster.kubernetes.image, e.g."],
        id="no-image",
    ),
    pytest.param(
        [*K8S, "cluster.kubernetes.name=3b-model"],
        ['cluster.kubernetes.name="3b-model" (command-line override) is not an RFC 1035 label', "name=b-model"],
        id="name-starts-with-a-digit",
    ),
    pytest.param(
        ["--spec", SERVE_SPEC, f"cluster.kubernetes.name={'a' * 51}"],
        [
            "is too long: the controller-revision-hash label of the last group's worker StatefulSet would be",
            "64 characters, and the API server refuses it past 63; set cluster.kubernetes.name to at most 50",
        ],
        id="name-too-long-for-the-leaderworkerset",
    ),
    pytest.param(
        [*K8S, "serve=null", f"cluster.kubernetes.name={'a' * 50}"],
        [
            "the JobSet's last pod with the 5 random characters its webhook adds",
            "set cluster.kubernetes.name to at most 48",
        ],
        id="name-too-long-for-the-jobset-pods",
    ),
    pytest.param(
        [*K8S, "cluster.kubernetes.serve_flavor=rayservice", "serve.host=0.0.0.0"],
        ['serve.api_key_env="VLLM_API_KEY"', "the app checks no API key", "serve_flavor=leaderworkerset"],
        id="rayservice-without-auth",
    ),
    pytest.param(
        [
            *K8S,
            *SERVES,
            "cluster.env=['HF_HOME=/cache']",
            "cluster.kubernetes.secret_env=[{name:HF_HOME,secret:s,key:k}]",
        ],
        ["HF_HOME set more than once in the pods' environment", "keep one of each"],
        id="env-twice",
    ),
    pytest.param(
        [*K8S, "serve.api_key_env=null"],
        ['serve.host="127.0.0.1"', "the pod would never be ready", "set serve.host=0.0.0.0"],
        id="loopback-server",
    ),
    pytest.param(
        [*K8S, "serve.host=0.0.0.0"],
        ['serve.api_key_env="VLLM_API_KEY"', "names a variable no pod has", "cluster.kubernetes.secret_env=[{name"],
        id="api-key-from-no-secret",
    ),
    pytest.param(
        [*K8S, *SERVES, "serve.replicas=2000000"],
        ["serve.replicas=2000000 (command-line override) of 1 pod(s) each", "set serve.replicas=1000000 or fewer"],
        id="leaderworkerset-replicas",
    ),
]


@pytest.mark.parametrize(("overrides", "expected"), ERRORS)
def test_rules_refuse_with_the_key_and_a_fix(lmspec, overrides: list[str], expected: list[str]) -> None:
    lmspec("check", *overrides).assert_reports(1, expected)


def test_the_grace_period_is_checked_against_the_estimated_stop(lmspec) -> None:
    """A step, then a synchronous save's staging and persist (the step-time and checkpoint models' numbers):
    the message gives the estimate and the grace period that covers it."""
    plan = make_plan([], Path(TRAIN_SPEC))
    stop = stop_time(plan.trained().spec)
    assert stop is not None and 10 < stop.total_s < plan.spec.cluster.kubernetes.termination_grace_seconds
    result = lmspec("check", "--spec", TRAIN_SPEC, "cluster.kubernetes.termination_grace_seconds=10")
    result.assert_reports(
        1,
        [
            "cluster.kubernetes.termination_grace_seconds=10 (command-line override) is shorter than the "
            f"{stop.total_s:,.0f} s a stop takes after SIGTERM",
            f"written in {stop.persist_s:,.0f} s at cluster.storage_write_gb_per_s=",
            f"Set cluster.kubernetes.termination_grace_seconds={int(stop.total_s * 1.5) + 1}",
        ],
    )


def test_cluster_kubernetes_is_judged_only_under_its_launcher(lmspec) -> None:
    assert lmspec("check", "cluster.kubernetes.name=3b-model").code == 0


def test_the_default_spec_and_the_examples_compile(lmspec, tmp_path: Path) -> None:
    assert lmspec("compile", "-o", str(tmp_path), *K8S, *SERVES).code == 0
    for spec in (TRAIN_SPEC, SERVE_SPEC):
        result = lmspec("compile", "-o", str(tmp_path), "--spec", spec)
        assert result.code == 0, result.err
        assert "error" not in result.err


POD_SH_VARIANTS = {
    "trainjob-one-node-engine": [*K8S, *SERVES],
    "jobset": [*K8S, "cluster.kubernetes.flavor=jobset", "hardware.nodes=2", "cluster.master_port=29400", *SERVES],
    "serve-two-nodes": [*K8S, *SERVES, "serve=default", "hardware.nodes=2", "serve.pp=2"],
}


@pytest.mark.parametrize("overrides", POD_SH_VARIANTS.values(), ids=POD_SH_VARIANTS.keys())
def test_pod_sh_passes_shellcheck_and_bash_n(overrides: list[str], shellcheck: str, tmp_path: Path) -> None:
    _, files = compiled(overrides)
    script = tmp_path / "pod.sh"
    script.write_text(files[K8S_POD_SH])
    for check in ([shellcheck, str(script)], ["bash", "-n", str(script)]):
        result = subprocess.run(check, capture_output=True, text=True, check=False)
        assert result.returncode == 0, result.stdout + result.stderr


def mounted(files: dict[str, str], objects: list[dict[str, Any]]) -> dict[str, str]:
    """What the pods' projected volume shows: each item of each ConfigMap source at its path."""
    maps = {doc["metadata"]["name"]: doc["data"] for doc in documents(files[K8S_BUILD])}
    volume = next(v for node in walk(objects) for v in node.get("volumes", []) if "projected" in v)
    return {
        item["path"]: maps[source["configMap"]["name"]][item["key"]]
        for source in volume["projected"]["sources"]
        for item in source["configMap"]["items"]
    }


@pytest.mark.parametrize("limit", [CONFIG_MAP_BYTES, 160 << 10], ids=["one-config-map", "split"])
def test_the_build_config_maps_carry_every_file_byte_for_byte(limit: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every file a pod reads (all but the report and the job files) comes back from the mount as compiled; each
    ConfigMap stays within its limit (lowered here so the training spec's build needs several)."""
    monkeypatch.setattr(build_config, "CONFIG_MAP_BYTES", limit)
    monkeypatch.setattr(build_config, "MANIFEST_ROOM_BYTES", 16 << 10)
    _, files = compiled([], Path(TRAIN_SPEC))
    config_maps = documents(files[K8S_BUILD])
    assert (len(config_maps) > 1) == (limit < CONFIG_MAP_BYTES)
    for config_map in config_maps:
        assert sum(len(key) + len(text.encode()) for key, text in config_map["data"].items()) <= limit
    carried = pod_files(files)
    assert MANIFEST in carried and K8S_POD_SH in carried and K8S_TRAIN not in carried
    assert mounted(files, documents(files[K8S_TRAIN])) == carried


def test_a_file_no_config_map_holds_is_refused() -> None:
    with pytest.raises(UsageError, match="more than a ConfigMap holds"):
        split({"convert/mapping.json": "x" * CONFIG_MAP_BYTES})
    assert config_key("serve/prefill/vllm.yaml") == "serve--prefill--vllm.yaml"


@pytest.mark.parametrize(
    "text", ["y", "N", "plain", "two\nlines\n", "trailing space \nnext", "tab\there\n", "é ü\n", "\x01 control\n", ""]
)
def test_strings_load_back_as_kubectl_reads_them(text: str) -> None:
    """Every string round-trips, and YAML 1.1's y/n booleans (go-yaml's, kubectl's) are quoted."""
    dumped = dump_objects([{"value": text}])
    assert documents(dumped) == [{"value": text}]
    if text in ("y", "N"):
        assert f'value: "{text}"' in dumped


GPU_JOB = ["model=llama3_8b", "hardware=h100_80g", "hardware.nodes=2", "parallel.distributed_optimizer=true"]
FLAVORS = {
    "trainjob": (K8S_TRAIN, [*K8S, *SERVES], ["ClusterTrainingRuntime", "TrainJob"]),
    "jobset": (K8S_TRAIN, [*K8S, *SERVES, "cluster.kubernetes.flavor=jobset"], ["JobSet"]),
    "leaderworkerset": (K8S_SERVE, [*K8S, *SERVES], ["LeaderWorkerSet", "Service"]),
    "rayservice": (K8S_SERVE, [*K8S, *SERVES, "cluster.kubernetes.serve_flavor=rayservice"], ["RayService"]),
}


@pytest.mark.parametrize(("job_file", "overrides", "kinds"), FLAVORS.values(), ids=FLAVORS.keys())
def test_each_flavor_emits_its_objects(job_file: str, overrides: list[str], kinds: list[str]) -> None:
    _, files = compiled([*overrides, *GPU_JOB])
    objects = documents(files[job_file])
    assert [o["kind"] for o in objects] == kinds
    assert "podTemplateOverrides" not in files[job_file]


def test_training_pods_run_pod_sh_train_with_their_controllers_contract() -> None:
    plan, files = compiled([], Path(TRAIN_SPEC))
    runtime, job = documents(files[K8S_TRAIN])
    k = plan.spec.cluster.kubernetes
    assert (
        job["spec"]["runtimeRef"]["name"] == runtime["metadata"]["name"] == f"{k.namespace}.{job['metadata']['name']}"
    )
    assert job["spec"]["trainer"] == {"numNodes": 4, "numProcPerNode": 8}
    assert job["spec"]["suspend"] is True and job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == k.queue
    replicated = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    assert [r["name"] for r in replicated] == ["node"]
    assert replicated[0]["template"]["metadata"]["labels"] == {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}
    (node,) = containers([runtime])
    assert node["name"] == "node" and node["command"] == ["bash", f"{k.build_dir}/{K8S_POD_SH}", "train"]
    assert node["resources"]["limits"] == {"nvidia.com/gpu": "8", "rdma/ib": "8", "cpu": "96", "memory": "1600Gi"}
    assert node["securityContext"] == {"capabilities": {"add": ["IPC_LOCK"]}}
    assert 'export MASTER_ADDR="${PET_MASTER_ADDR' in files[K8S_POD_SH]


def test_serving_pods_run_pod_sh_as_leader_and_worker() -> None:
    plan, files = compiled([], Path(SERVE_SPEC))
    lws, service = documents(files[K8S_SERVE])
    group = lws["spec"]["leaderWorkerTemplate"]
    assert group["size"] == plan.served().layout.nodes == 2
    assert group["restartPolicy"] == "RecreateGroupOnPodRestart"
    roles = [c["command"][-1] for c in containers([group["leaderTemplate"], group["workerTemplate"]])]
    assert roles == ["serve-leader", "serve-worker"]
    assert service["spec"]["selector"]["leaderworkerset.sigs.k8s.io/worker-index"] == "0"
    assert service["spec"]["ports"][0]["port"] == plan.served().spec.serve.port
    env = containers([group["workerTemplate"]])[0]["env"]
    assert env == [{"name": "VLLM_API_KEY", "valueFrom": {"secretKeyRef": {"name": "vllm-api-key", "key": "token"}}}]


def test_the_build_config_maps_are_outside_the_manifest_and_drift_checked(tmp_path: Path) -> None:
    """k8s/build.yaml is made from the manifest, so it is not listed there; `compile --check` still compares it,
    and a compile replaces a build holding it, whatever the new launcher."""
    _, files = compiled([*K8S, *SERVES])
    assert K8S_BUILD not in yaml.safe_load(files[MANIFEST])["files"]
    target = tmp_path / "tiny"
    write_build(target, files)
    write_build(target, files)  # the earlier build, k8s/build.yaml included, is replaced and removed whole
    assert [path.name for path in tmp_path.iterdir()] == ["tiny"]
    assert stale_files(target, files) == []
    (target / K8S_BUILD).write_text(files[K8S_BUILD] + "# edited\n")
    assert stale_files(target, files) == [f"{K8S_BUILD} (changed)"]
    _, local = compiled(SERVES)
    assert "k8s/ (not emitted)" in stale_files(target, local)
    write_build(target, local)
    assert not (target / "k8s").exists() and [path.name for path in tmp_path.iterdir()] == ["tiny"]


FAKE_TORCHRUN = """\
trap '' USR1  # as launch/torchrun.sh: the launcher survives the stop, its ranks handle it
"$LMSPEC_PYTHON" -c '
import os, signal, sys, time
os.setsid()  # torchrun starts each rank in a session of its own
signal.signal(signal.SIGUSR1, lambda *_: sys.exit(3))
open(sys.argv[1], "w").close()
time.sleep(60)
' "$RANK_READY" &
wait $!
"""


def test_pod_sh_sends_the_stop_to_ranks_in_sessions_of_their_own(tmp_path: Path) -> None:
    """SIGTERM to pod.sh (the container's PID 1) reaches a rank outside the launcher's process group as USR1,
    and pod.sh exits with the launcher's code once the rank has stopped. The launcher is a stand-in here; the
    pods' real training is tests/k8s/."""
    _, files = compiled([*K8S, "cluster.kubernetes.flavor=jobset", "serve=null"])
    mount = tmp_path / "mount"
    for rel, text in pod_files(files).items():
        (mount / rel).parent.mkdir(parents=True, exist_ok=True)
        (mount / rel).write_text(FAKE_TORCHRUN if rel == "launch/torchrun.sh" else text)
    ready = tmp_path / "rank-ready"
    env = {
        "PATH": "/usr/bin:/bin",
        "JOB_COMPLETION_INDEX": "0",
        "LMSPEC_PYTHON": sys.executable,
        "RANK_READY": str(ready),
    }
    pod = subprocess.Popen(["bash", str(mount / K8S_POD_SH), "train"], cwd=tmp_path, env=env, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    pod.send_signal(signal.SIGTERM)
    _, err = pod.communicate(timeout=30)
    assert pod.returncode == 3, err.decode()
    assert b"pod.sh: SIGTERM: sending USR1 to the train processes" in err


def test_the_ray_service_answers_on_serve_port() -> None:
    """Ray Serve's proxy listens where serve.port says (http_options), and KubeRay's serve Service forwards to the
    head container's port named `serve`: both the spec's port, not Serve's default 8000."""
    _, files = compiled([*K8S, *SERVES, *GPU_JOB, "cluster.kubernetes.serve_flavor=rayservice", "serve.port=9100"])
    (service,) = documents(files[K8S_SERVE])
    config = yaml.safe_load(service["spec"]["serveConfigV2"])
    assert config["http_options"] == {"host": "0.0.0.0", "port": 9100}
    head = service["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert head["ports"] == [{"name": "serve", "containerPort": 9100, "protocol": "TCP"}]
