"""The pod every object of the job runs (core/v1 PodSpec as a plain dict), from cluster.kubernetes.

One container of cluster.kubernetes.image runs k8s/pod.sh in its role, from the working directory where runs/
goes (a persistent volume claim, else an emptyDir). Its environment is cluster.env and the Secrets' variables
(secretKeyRef only: no secret value enters the build); it asks for the node's accelerators (hardware's GPUs
as cluster.kubernetes.gpu_resource, none on CPU hardware), its RDMA devices and IPC_LOCK to pin their memory;
/dev/shm is a memory-backed emptyDir (the runtime's 64 MiB default breaks NCCL and DataLoader workers); the
build is a projected volume of the build ConfigMaps (lmspec.compiler.launchers.k8s.build_config).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from lmspec.compiler.launchers.k8s.build_config import volume_sources
from lmspec.compiler.launchers.k8s.names import POD_IP_ENV, labels, object_name
from lmspec.compiler.plan import Plan

SHM, WORK, BUILD = "dshm", "work", "build"  # the pod's volumes
SHM_PATH = "/dev/shm"


def training_gpus(plan: Plan) -> int:
    """Accelerators each training pod asks for: its node's ranks' GPUs (none on CPU hardware)."""
    return plan.trained().layout.gpus_per_node if plan.device == "gpu" else 0


def serving_gpus(plan: Plan) -> int:
    """Accelerators each serving pod asks for: the most any node of the engine uses (none on CPU hardware)."""
    return max(role.gpus_per_node for role in plan.served().layout.roles) if plan.device == "gpu" else 0


def environment(plan: Plan, own_address: bool) -> list[dict[str, Any]]:
    """cluster.env's values, each Secret's variable by reference, and with `own_address` the pod's IP."""
    k = plan.spec.cluster.kubernetes
    env: list[dict[str, Any]] = []
    for assignment in plan.spec.cluster.env:
        name, _, value = assignment.partition("=")
        env.append({"name": name, "value": value})
    env += [{"name": s.name, "valueFrom": {"secretKeyRef": {"name": s.secret, "key": s.key}}} for s in k.secret_env]
    if own_address:
        env.append({"name": POD_IP_ENV, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}})
    return env


def resources(plan: Plan, gpus: int) -> dict[str, Any]:
    """Requests equal to limits (extended resources allow nothing else): `gpus` accelerators and beside them the
    RDMA devices their traffic goes through, cluster.kubernetes' CPUs and memory."""
    k = plan.spec.cluster.kubernetes
    amounts = {
        k.gpu_resource: str(gpus) if gpus else None,
        k.rdma_resource: str(k.rdma_per_node) if k.rdma_resource and gpus else None,
        "cpu": str(k.cpus) if k.cpus else None,
        "memory": k.memory,
    }
    limits = {resource: amount for resource, amount in amounts.items() if resource and amount}
    return {"limits": limits, "requests": dict(limits)} if limits else {}


def container(plan: Plan, name: str, command: list[str] | None, gpus: int, own_address: bool) -> dict[str, Any]:
    """The container `name` running `command` (None: the image's, for pods whose controller starts them, which
    then mount no build) with `gpus` accelerators; `own_address`: it reads its pod's IP."""
    k = plan.spec.cluster.kubernetes
    assert k.image is not None, "the rules refuse cluster.kubernetes.image=null for this launcher"
    build = [] if command is None else [{"name": BUILD, "mountPath": k.build_dir, "readOnly": True}]
    optional = {"command": command, "env": environment(plan, own_address), "resources": resources(plan, gpus)}
    spec: dict[str, Any] = {
        "name": name,
        "image": k.image,
        **{field: value for field, value in optional.items() if value},
        "workingDir": k.work_dir,
        "volumeMounts": [{"name": SHM, "mountPath": SHM_PATH}, {"name": WORK, "mountPath": k.work_dir}, *build],
    }
    if k.ipc_lock:
        spec["securityContext"] = {"capabilities": {"add": ["IPC_LOCK"]}}
    return spec


def volumes(plan: Plan, files: dict[str, str] | None) -> list[dict[str, Any]]:
    """/dev/shm, the working directory and the build (`files`: every build file but the manifest and the job
    files, whose split into ConfigMaps the projected volume follows; None for pods that read no build)."""
    k = plan.spec.cluster.kubernetes
    work = {"persistentVolumeClaim": {"claimName": k.volume_claim}} if k.volume_claim else {"emptyDir": {}}
    build = (
        []
        if files is None
        else [{"name": BUILD, "projected": {"sources": volume_sources(object_name(plan.spec), files)}}]
    )
    return [
        {"name": SHM, "emptyDir": {"medium": "Memory", "sizeLimit": f"{k.shm_gib}Gi"}},
        {"name": WORK, **work},
        *build,
    ]


def pod_spec(plan: Plan, files: dict[str, str] | None, containers: list[dict[str, Any]]) -> dict[str, Any]:
    """The pod around `containers`: volumes, scheduling (node selector, tolerations), pull secrets, service
    account, and the grace period a SIGTERM gives pod.sh."""
    k = plan.spec.cluster.kubernetes
    spec: dict[str, Any] = {
        "containers": containers,
        "volumes": volumes(plan, files),
        "terminationGracePeriodSeconds": k.termination_grace_seconds,
    }
    if k.node_selector:
        spec["nodeSelector"] = dict(label.split("=", 1) for label in k.node_selector)
    if k.tolerations:
        spec["tolerations"] = [
            {field: value for field, value in dataclasses.asdict(t).items() if value is not None} for t in k.tolerations
        ]
    if k.image_pull_secrets:
        spec["imagePullSecrets"] = [{"name": secret} for secret in k.image_pull_secrets]
    if k.service_account:
        spec["serviceAccountName"] = k.service_account
    return spec


def template(plan: Plan, spec: dict[str, Any]) -> dict[str, Any]:
    """A pod template: the job's labels on the pod spec."""
    return {"metadata": {"labels": labels(object_name(plan.spec))}, "spec": spec}
