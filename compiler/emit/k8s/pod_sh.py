"""k8s/pod.sh: every container's command, `bash <build mount>/k8s/pod.sh ROLE` (templates/k8s_pod.sh.j2).

The roles are the parts of the job that run in pods: `train` (a TrainJob's or JobSet's node), `serve-leader` and
`serve-worker` (a LeaderWorkerSet's). The script holds nothing absolute: the build is its own directory's
parent, the working directory the pod's, and the rest the controllers' environment, so a test runs the same
command with the mounts elsewhere.
"""

from __future__ import annotations

from lmspec.compiler.build.files import (
    K8S_POD_SH,
    MANIFEST,
    SERVE_HEAD_SH,
    SERVE_SH,
    SERVE_WORKER_SH,
    TORCHRUN_SH,
)
from lmspec.compiler.emit.quoting import Quoted, shell, word
from lmspec.compiler.emit.render import render
from lmspec.compiler.launchers.k8s.names import POD_IP_ENV, TRAINER_PORT, jobset_master_host, object_name
from lmspec.compiler.plan import Plan

TRAIN, SERVE_LEADER, SERVE_WORKER = "train", "serve-leader", "serve-worker"
TRAINJOB = "trainjob"  # cluster.kubernetes.flavor whose pods read Kubeflow Trainer's PET_* (else a JobSet's)


def command(plan: Plan, role: str) -> list[str]:
    """The container's command: pod.sh of the build mount, in `role`."""
    return ["bash", f"{plan.spec.cluster.kubernetes.build_dir}/{K8S_POD_SH}", role]


def roles(plan: Plan, lws: bool) -> list[str]:
    """The roles this build's pods run: training's, and a LeaderWorkerSet's (`lws`) leader and workers."""
    serving = [SERVE_LEADER, *([SERVE_WORKER] if plan.served().layout.nodes > 1 else [])] if lws else []
    return [*([TRAIN] if plan.train is not None else []), *serving]


def pod_sh(plan: Plan, lws: bool) -> str:
    """pod.sh for the roles of `roles`; `lws`: the spec serves as a LeaderWorkerSet."""
    k, name = plan.spec.cluster.kubernetes, object_name(plan.spec)
    trains, nodes = plan.train is not None, plan.served().layout.nodes if lws else 1
    return render(
        "k8s_pod.sh.j2",
        name=plan.name,
        roles=", ".join(roles(plan, lws)),
        manifest=word(MANIFEST),
        train=word(TRAIN) if trains else None,
        trainer=k.flavor == TRAINJOB,
        nnodes=plan.trained().layout.nodes if trains else 0,
        nproc=plan.trained().layout.gpus_per_node if trains else 0,
        master_host=shell(jobset_master_host(name)),
        master_port=plan.spec.cluster.master_port or TRAINER_PORT,
        torchrun=word(TORCHRUN_SH),
        serve=lws,
        leader=word(SERVE_LEADER),
        worker=word(SERVE_WORKER),
        nodes=nodes,
        one_node=nodes == 1,
        serve_sh=word(SERVE_SH),
        head_sh=word(SERVE_HEAD_SH),
        worker_sh=word(SERVE_WORKER_SH),
        pod_ip=Quoted(f'"${{{word(POD_IP_ENV)}:?the pod spec sets {word(POD_IP_ENV)} from status.podIP}}"'),
    )
