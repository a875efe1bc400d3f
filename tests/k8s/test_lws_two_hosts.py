"""The emitted LeaderWorkerSet's two pods serve the tiny model with vLLM's CPU engine across two hosts.

A serve-only spec (2 nodes x 1, serve.tp=2: vLLM's mp executor across nodes) compiles with cluster=kubernetes to
k8s/serve.yaml. Two network namespaces are the group's pods, each resolving the names LWS's headless Service
gives them (`<name>-0.<name>.<namespace>`: the leader, LWS_LEADER_ADDRESS; `<name>-0-1...`: worker 1). Each runs its
template's container command (leader: `pod.sh serve-leader`, worker: `pod.sh serve-worker`) with what LWS and the
kubelet inject (LWS_LEADER_ADDRESS, LWS_GROUP_SIZE, LWS_WORKER_INDEX; POD_IP from the downward API) and the build
ConfigMaps mounted as the kubelet mounts them (tests/helpers/k8s_pods.py); the model sits on the shared volume.
A client on the worker's host asks the leader's API, which answers from an engine of two tensor-parallel ranks.
Two vLLM process trees (~1-2 min to healthy on 2 idle cores, ~3 GB each). Needs root and iproute2.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.build import compile_build
from helpers.hf import save_random_hf_llama
from helpers.k8s_pods import documents, prepare_pod
from helpers.marks import needs_vllm
from helpers.netns import IFNAME, hosts, netns_missing_reason
from helpers.processes import kill_group
from helpers.specs import SERVED_TP2_ON_TWO_HOSTS
from helpers.two_host_engine import assert_one_tp2_engine_answers, wait_healthy

from lmspec.compiler.build.files import K8S_BUILD, K8S_SERVE
from lmspec.compiler.launch_names import CPU_VLLM_CLI, VLLM_CLI_ENV
from lmspec.runtime.data.byte_tokenizer import save_byte_tokenizer

pytestmark = [
    needs_vllm,
    pytest.mark.slow,
    pytest.mark.skipif(netns_missing_reason() is not None, reason=str(netns_missing_reason())),
]

NAME = "k8sserve"
NAMESPACE = "serving"
PORT = 8000


def test_the_leader_worker_set_serves_across_two_hosts(tmp_path: Path) -> None:
    volume = tmp_path / "volume"  # the claim both pods mount at work_dir
    save_random_hf_llama(compile_build(tmp_path / "probe", []).plan, volume / "models" / "tiny")
    save_byte_tokenizer(volume / "models" / "tiny")
    plan, build = compile_build(
        tmp_path / "build",
        [
            f"name={NAME}",
            "cluster=kubernetes",
            "cluster.kubernetes.image=ghcr.io/example/lmspec:test",
            f"cluster.kubernetes.namespace={NAMESPACE}",
            *SERVED_TP2_ON_TWO_HOSTS,
            "serve.model_path=models/tiny",  # relative: on the volume, the pods' working directory
            f"serve.port={PORT}",
        ],
    )
    objects = documents(build / K8S_SERVE) + documents(build / K8S_BUILD)
    (lws,) = [o for o in objects if o["kind"] == "LeaderWorkerSet"]
    group = lws["spec"]["leaderWorkerTemplate"]
    assert group["size"] == 2
    k8s = plan.spec.cluster.kubernetes
    leader_name = f"{NAME}-0.{NAME}.{NAMESPACE}"  # LWS_LEADER_ADDRESS: the leader pod in the headless Service
    names = [[leader_name, f"{NAME}-0"], [f"{NAME}-0-1.{NAME}.{NAMESPACE}", f"{NAME}-0-1"]]
    image_env = {
        "PATH": os.environ["PATH"],
        "HOME": os.environ.get("HOME", "/root"),
        VLLM_CLI_ENV: str(Path(sys.executable).parent / CPU_VLLM_CLI),  # the image's vLLM
        "PYTHONUNBUFFERED": "1",
    }
    logs = [tmp_path / "leader.log", tmp_path / "worker.log"]
    procs: list[subprocess.Popen] = []
    with hosts(2, "lw", names=names) as nodes:
        for host in nodes:  # vLLM finds the address it advertises by routing towards one (see test_serve_mp_two_hosts)
            subprocess.run(["ip", "-n", host.netns, "route", "add", "default", "dev", IFNAME], check=True)
        lws_env = {"LWS_LEADER_ADDRESS": leader_name, "LWS_GROUP_SIZE": "2", "LWS_NAME": NAME}
        pods = [
            prepare_pod(
                objects,
                group[f"{role}Template"]["spec"],
                {k8s.build_dir: tmp_path / f"{role}-build", k8s.work_dir: volume},
                {**image_env, **lws_env, "LWS_WORKER_INDEX": str(index), "POD_IP": node.address},
            )
            for index, (role, node) in enumerate(zip(("leader", "worker"), nodes, strict=True))
        ]
        for pod in pods:
            pod.cwd.mkdir(parents=True, exist_ok=True)
        try:
            for host, pod, log in zip(nodes, pods, logs, strict=True):
                with log.open("w") as out:
                    procs.append(
                        subprocess.Popen(
                            host.command(pod.argv),
                            cwd=pod.cwd,
                            env=pod.env,
                            stdout=out,
                            stderr=subprocess.STDOUT,
                            start_new_session=True,
                        )
                    )
            api = f"http://{leader_name}:{PORT}"
            wait_healthy(nodes[1], f"{api}/health", procs, logs)
            assert_one_tp2_engine_answers(nodes[1], api, plan.spec.serve.served_model_name, logs[1])
        finally:
            for proc in procs:
                kill_group(proc)
