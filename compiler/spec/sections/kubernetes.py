"""`cluster.kubernetes`: the objects a Kubernetes cluster runs the job as (cluster.launcher=kubernetes).

Training becomes a Kubeflow Trainer v2 TrainJob over a ClusterTrainingRuntime of lmspec's (`flavor: trainjob`)
or a JobSet (`flavor: jobset`); multi-node serving a LeaderWorkerSet with a leader Service
(`serve_flavor: leaderworkerset`) or a KubeRay RayService (`serve_flavor: rayservice`); a ConfigMap carries
the build into every pod (lmspec.compiler.launchers.kubernetes). Every value here is written into those
objects, so each is checked against the syntax the API server checks it with (lmspec.compiler.spec.kinds).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from lmspec.compiler.spec import kinds
from lmspec.compiler.spec.sections.declare import key

GRACE_SECONDS_MAX = 7 * 86400
SHM_GIB_MAX = 2**14


@dataclass(frozen=True, kw_only=True)
class TolerationSpec:
    """One toleration of the pods (core/v1 Toleration): which node taints they accept."""

    operator: Literal["Exists", "Equal"] = key("Exists (any value) or Equal (value must match).", example="Exists")
    value: str | None = key("The taint value, with operator Equal.", example="present", kind=kinds.K8S_KEY)
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = key(
        "The taint effect it tolerates; null = every effect.", example="NoSchedule"
    )
    # last: below this line `key` is the field, no longer lmspec's declare.key
    key: str | None = key(
        "The taint key; null with operator Exists tolerates every taint.",
        example="nvidia.com/gpu",
        kind=kinds.K8S_RESOURCE,
    )


@dataclass(frozen=True, kw_only=True)
class SecretEnvSpec:
    """An environment variable every container reads from a Secret (valueFrom.secretKeyRef): the value never
    enters the spec, the build or the manifests."""

    name: str = key("The variable's name in the container.", example="HF_TOKEN", kind=kinds.ENV_NAME)
    secret: str = key("The Secret's name, in cluster.kubernetes.namespace.", example="hf-token", kind=kinds.K8S_NAME)
    # last: below this line `key` is the field, no longer lmspec's declare.key
    key: str = key("The key of the Secret's data holding the value.", example="token", kind=kinds.K8S_KEY)


@dataclass(frozen=True, kw_only=True)
class KubernetesSpec:
    """Kubernetes objects for the job (used when cluster.launcher is kubernetes)."""

    flavor: Literal["trainjob", "jobset"] = key(
        "Training as a Kubeflow Trainer v2 TrainJob on a ClusterTrainingRuntime lmspec emits (trainjob), or as a "
        "JobSet (jobset), for clusters without Kubeflow Trainer.",
        example="trainjob",
    )
    serve_flavor: Literal["leaderworkerset", "rayservice"] = key(
        "Serving as a LeaderWorkerSet with a Service in front of each group's leader (leaderworkerset; vLLM in "
        "the spec's serve.multi_node mode), or as a KubeRay RayService (rayservice; Ray Serve's vLLM app).",
        example="leaderworkerset",
    )
    name: str | None = key(
        "The objects' name (TrainJob, JobSet, LeaderWorkerSet, ConfigMap prefix): the pods' DNS names start "
        "with it; null = the spec's name, lowercased, with _ and . as -.",
        example="llama3-8b",
        kind=kinds.K8S_NAME,
    )
    namespace: str = key("The namespace every object goes in.", example="ml-training", kind=kinds.K8S_NAME)
    image: str | None = key(
        "The container image every pod runs: it must hold lmspec with its training or serving stack "
        "(lmspec's own Python as $LMSPEC_PYTHON, or python3); null is refused for this launcher.",
        example="ghcr.io/my-team/lmspec:0.1",
        kind=kinds.K8S_IMAGE,
    )
    image_pull_secrets: list[str] = key(
        "Secrets holding the registry credentials for the image.",
        example=["regcred"],
        kind=kinds.K8S_NAME,
        max_items=kinds.SITE_LINES_MAX,
    )
    service_account: str | None = key(
        "The pods' service account; null = the namespace's default.", example="trainer", kind=kinds.K8S_NAME
    )
    node_selector: list[str] = key(
        "Node labels every pod's node must carry, KEY=VALUE (nodeSelector).",
        example=["nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3"],
        kind=kinds.K8S_LABEL,
        max_items=kinds.SITE_LINES_MAX,
    )
    tolerations: list[TolerationSpec] = key(
        "Taints the pods tolerate (GPU nodes are often tainted).",
        example=[{"key": "nvidia.com/gpu", "operator": "Exists", "value": None, "effect": "NoSchedule"}],
        max_items=kinds.SITE_LINES_MAX,
    )
    gpu_resource: str = key(
        "The extended resource a node's GPUs are counted in; each pod asks for hardware.gpus_per_node of it.",
        example="nvidia.com/gpu",
        kind=kinds.K8S_RESOURCE,
    )
    rdma_resource: str | None = key(
        "The extended resource of the node's RDMA devices (the RDMA or SR-IOV device plugin's name); null = none.",
        example="rdma/ib",
        kind=kinds.K8S_RESOURCE,
    )
    rdma_per_node: int = key(
        "How many of rdma_resource each pod asks for (usually one per NIC: hardware.inter_node.nics).",
        example=8,
        minimum=1,
        maximum=kinds.NICS_MAX,
    )
    ipc_lock: bool = key(
        "Add the IPC_LOCK capability: RDMA registers (pins) memory, which an unprivileged container may not.",
        example=True,
    )
    cpus: int | None = key(
        "CPU cores each pod requests and is limited to; null = no request.",
        example=96,
        minimum=1,
        maximum=kinds.CPUS_MAX,
    )
    memory: str | None = key(
        "Memory each pod requests and is limited to, a Kubernetes quantity; null = no request.",
        example="1600Gi",
        kind=kinds.K8S_QUANTITY,
    )
    shm_gib: int = key(
        "Size of /dev/shm (a memory-backed emptyDir): the container runtime's 64 MiB default breaks NCCL and "
        "DataLoader workers.",
        example=64,
        minimum=1,
        maximum=SHM_GIB_MAX,
    )
    volume_claim: str | None = key(
        "A PersistentVolumeClaim mounted at work_dir in every pod, for checkpoints, data and runs/ (it must "
        "allow ReadWriteMany for several nodes); null = an emptyDir, lost with the pod.",
        example="lmspec-scratch",
        kind=kinds.K8S_NAME,
    )
    work_dir: str = key(
        "The pods' working directory, where runs/ (checkpoints, metrics) and relative data paths are: the "
        "claim's mount path.",
        example="/workspace",
        kind=kinds.PATH,
    )
    build_dir: str = key(
        "Where the ConfigMap carrying the build is mounted in every pod.", example="/lmspec/build", kind=kinds.PATH
    )
    queue: str | None = key(
        "Kueue's LocalQueue: the objects get the kueue.x-k8s.io/queue-name label and start suspended until "
        "Kueue admits them; null = no Kueue.",
        example="team-a",
        kind=kinds.K8S_NAME,
    )
    secret_env: list[SecretEnvSpec] = key(
        "Environment variables read from Secrets (secretKeyRef), never written into the build.",
        example=[{"name": "HF_TOKEN", "secret": "hf-token", "key": "token"}],
        max_items=kinds.SITE_LINES_MAX,
    )
    termination_grace_seconds: int = key(
        "terminationGracePeriodSeconds: after SIGTERM (eviction, preemption, deletion) the trainer finishes "
        "its step and saves before the kubelet kills it; checked against the estimated save time.",
        example=900,
        minimum=1,
        maximum=GRACE_SECONDS_MAX,
    )
    max_restarts: int = key(
        "How many times a failed job is restarted as a whole (failurePolicy.maxRestarts); each restart "
        "resumes from the newest checkpoint on the volume.",
        example=3,
        minimum=0,
        maximum=kinds.KEEP_MAX,
    )
