"""REPORT.md's Kubernetes section (the launcher's `report`): the objects of each job file, what each pod asks
for, where runs/ lives, how the pods are scheduled and stopped, and how to apply them."""

from __future__ import annotations

from lmspec.compiler.build.files import K8S_BUILD, K8S_POD_SH, K8S_SERVE, K8S_TRAIN
from lmspec.compiler.emit.k8s.pod import resources, serving_gpus, training_gpus
from lmspec.compiler.emit.k8s.pod_sh import TRAIN, TRAINJOB
from lmspec.compiler.emit.k8s.training import runtime_name
from lmspec.compiler.emit.report_format import seconds
from lmspec.compiler.launchers.k8s.names import config_map_name, leader_service, object_name
from lmspec.compiler.launchers.kubernetes import RAY_SERVE, stop_time
from lmspec.compiler.plan import Plan

HEADING = "Kubernetes"


def kubernetes_section(plan: Plan) -> tuple[str, list[tuple[str, str]]]:
    k, name = plan.spec.cluster.kubernetes, object_name(plan.spec)
    rows = [("build", f"`{K8S_BUILD}`: ConfigMaps {config_map_name(name, 0)}, ... mounted at `{k.build_dir}`")]
    applied = []
    if plan.train is not None:
        nodes = plan.trained().layout.nodes
        kinds = (
            f"ClusterTrainingRuntime {runtime_name(plan)}, TrainJob {name}"
            if k.flavor == TRAINJOB
            else f"JobSet {name}"
        )
        rows += [
            ("training", f"`{K8S_TRAIN}`: {kinds}: {nodes} pod(s) running `{K8S_POD_SH} {TRAIN}`"),
            ("training pod", pod_resources(plan, training_gpus(plan))),
            ("stop", stop_row(plan)),
        ]
        applied.append((K8S_TRAIN, ""))
    if plan.serve is not None:
        served = plan.served()
        replicas, nodes = served.spec.serve.replicas, served.layout.nodes
        objects = (
            f"RayService {name}: {replicas * nodes} GPU worker pod(s) and a head"
            if k.serve_flavor == RAY_SERVE
            else f"LeaderWorkerSet {name} ({replicas} group(s) of {nodes} pod(s)), Service "
            f"{leader_service(name)}:{served.spec.serve.port}"
        )
        rows += [("serving", f"`{K8S_SERVE}`: {objects}"), ("serving pod", pod_resources(plan, serving_gpus(plan)))]
        applied.append((K8S_SERVE, " --stage serve"))
    volume = (
        f"claim {k.volume_claim}"
        if k.volume_claim
        else "an emptyDir, lost with the pod (cluster.kubernetes.volume_claim)"
    )
    rows.append(("working directory", f"`{k.work_dir}` on {volume}: runs/, checkpoints, data paths"))
    queue = f"; Kueue queue {k.queue} (created suspended)" if k.queue else ""
    rows.append(("namespace", f"{k.namespace}{queue}"))
    build = f"build/{plan.name}"
    rows += [
        (
            "apply",
            f"`lmspec run {build}{stage}`, or `kubectl apply --server-side -f {build}/{K8S_BUILD} -f {build}/{rel}`",
        )
        for rel, stage in applied
    ]
    return HEADING, rows


def pod_resources(plan: Plan, gpus: int) -> str:
    """What one pod of `gpus` accelerators asks for: its container's limits (lmspec.compiler.emit.k8s.pod), its
    /dev/shm and capabilities."""
    k = plan.spec.cluster.kubernetes
    limits = resources(plan, gpus).get("limits", {})
    asked = [*(f"{amount} {resource}" for resource, amount in limits.items()), f"/dev/shm {k.shm_gib} GiB"]
    return ", ".join([*asked, *(["IPC_LOCK"] if k.ipc_lock else [])])


def stop_row(plan: Plan) -> str:
    """The grace period beside the stop it must cover (lmspec.compiler.launchers.kubernetes.stop_time)."""
    k, stop = plan.spec.cluster.kubernetes, stop_time(plan.trained().spec)
    estimate = f" (a step and a save: {seconds(stop.total_s)}, estimated)" if stop is not None else ""
    return (
        f"SIGTERM: pod.sh sends USR1, the trainer finishes its step, saves and exits within the grace period, "
        f"{k.termination_grace_seconds} s{estimate}"
    )
