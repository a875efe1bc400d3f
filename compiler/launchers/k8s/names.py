"""The name every Kubernetes object of a job is named after, and the longest names the controllers make of it.

One name (cluster.kubernetes.name, or the spec's name lowercased with _ and . as -) names the TrainJob or JobSet,
the LeaderWorkerSet or RayService, the build ConfigMaps and the leader Service. The API server and the
controllers check more than the object's own name: each name they build from it must be an RFC 1035 label
(a letter first; at most 63 characters), so `too_long` prices those the job will have, as each controller
spells them (the versions the CRDs in ../shared/k8s-crds/ come from):
- JobSet v0.12.0 (and Kubeflow Trainer v2.3.0, whose TrainJob runs as a JobSet of its own name): its webhook
  checks `<jobset>-<replicated job>-<job index>-<pod index>` plus the 5 random characters of a pod's name;
- LeaderWorkerSet v0.10.0: the workers of group g are the StatefulSet `<lws>-<g>`, whose pods carry the
  controller-revision-hash label `<statefulset>-<hash of up to 10 characters>` (a label value: 63 at most);
- lmspec's own Service in front of the leaders, `<name>-leader` (LWS keeps `<name>` for its headless Service);
- KubeRay v1.7.0: a RayService name of at most 47 characters (MaxRayServiceNameLength: its RayClusters' names
  add 6).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the spec's sections import the launcher registry, which imports this
    from lmspec.compiler.spec.sections import Spec

DNS_LABEL_MAX = 63
RFC_1035_LABEL = re.compile(r"[a-z](?:[-a-z0-9]*[a-z0-9])?")
# Kubeflow Trainer's name for the replicated job and the container of its trainer (constants.Node): it injects
# PET_* into that container only; the JobSet flavor uses the same name
NODE = "node"
JOBSET_POD_SUFFIX = "-abcde"  # JobSet's webhook adds 5 random characters to the longest pod name it checks
REVISION_HASH = "-" + "h" * 10  # a StatefulSet's controller-revision-hash: its name, -, up to 10 characters
RAYSERVICE_NAME_MAX = 47  # KubeRay v1.7.0 utils.MaxRayServiceNameLength
LEADER_SERVICE_SUFFIX = "-leader"
# Kubeflow Trainer's rendezvous port (constants.ContainerTrainerPort, PET_MASTER_PORT), used by the JobSet flavor
# too when cluster.master_port is null
TRAINER_PORT = 29500
MANAGED_BY = "lmspec"
POD_IP_ENV = "POD_IP"  # the leader's own address (the downward API's status.podIP), which head.sh binds
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


def object_name(spec: Spec) -> str:
    """cluster.kubernetes.name, or the spec's name lowercased with _ and . as - (the spec's name kind admits
    letters, digits, _, . and - only)."""
    named = spec.cluster.kubernetes.name
    return named if named is not None else re.sub(r"[_.]", "-", spec.name.lower())


def labels(name: str) -> dict[str, str]:
    """The labels of every object and pod of the job: `kubectl get all -l app.kubernetes.io/instance=NAME`."""
    return {"app.kubernetes.io/instance": name, "app.kubernetes.io/managed-by": MANAGED_BY}


def leader_service(name: str) -> str:
    return f"{name}{LEADER_SERVICE_SUFFIX}"


def jobset_master_host(name: str) -> str:
    """Node 0's pod as the others reach it: JobSet's network.enableDNSHostnames names pod 0 of job 0 of the
    replicated job so, in the headless Service named after the JobSet."""
    return f"{name}-{NODE}-0-0.{name}"


def config_map_name(name: str, index: int) -> str:
    """The build's ConfigMap number `index` (a build larger than one ConfigMap's 1 MiB is split)."""
    return f"{name}-build-{index}"


@dataclass(frozen=True)
class BuiltName:
    """A name a controller makes of the objects' name, and the most characters it may have."""

    what: str
    text: str
    limit: int = DNS_LABEL_MAX

    @property
    def over(self) -> int:
        return len(self.text) - self.limit


def built_names(name: str, training_nodes: int | None, serve_replicas: int | None, ray: bool) -> list[BuiltName]:
    """The longest names the job's controllers make of `name`: those of its training (its node count), and of
    its serving (serve.replicas engines: a LeaderWorkerSet's groups, or a RayService with `ray`)."""
    built = []
    if training_nodes is not None:
        pod = f"{name}-{NODE}-0-{training_nodes - 1}{JOBSET_POD_SUFFIX}"
        built.append(BuiltName("the name of the JobSet's last pod with the 5 random characters its webhook adds", pod))
    if serve_replicas is not None and ray:
        built.append(
            BuiltName("the RayService (KubeRay adds 6 characters for its RayClusters)", name, RAYSERVICE_NAME_MAX)
        )
    elif serve_replicas is not None:
        built.append(BuiltName("the leader Service", leader_service(name)))
        workers = f"{name}-{serve_replicas - 1}{REVISION_HASH}"
        built.append(BuiltName("the controller-revision-hash label of the last group's worker StatefulSet", workers))
    return built


def suggested_name(name: str, length: int) -> str:
    """An RFC 1035 label of at most `length` characters made of `name`: a letter first, - for anything else."""
    text = re.sub(r"[^a-z0-9-]", "-", name.lower()).lstrip("-0123456789")
    text = text[:length].rstrip("-")
    return text or "job"[:length]
