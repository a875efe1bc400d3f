"""k8s/train.yaml: the training job, one pod per node running `pod.sh train`.

- flavor trainjob: a Kubeflow Trainer v2.3.0 TrainJob on a ClusterTrainingRuntime of its own. The runtime's
  template is the JobSet Trainer makes: replicated job `node`, labelled as the trainer's ancestor step, whose
  container `node` gets Trainer's PET_* (torch plugin: only when the TrainJob has a `trainer`, which sets
  numNodes and numProcPerNode). The runtime is cluster-scoped, so its name carries the namespace: two teams'
  jobs of one name never share a pod template. TrainJob has no podTemplateOverrides (removed in v2.2.0): every
  pod detail is in the runtime.
- flavor jobset: a JobSet v0.12.0 with DNS hostnames (pod 0 is `<name>-node-0-0.<name>`), one Indexed Job of
  `nodes` completions (JOB_COMPLETION_INDEX is the node rank) that fails at its first pod failure, so the
  JobSet restarts the whole job, up to cluster.kubernetes.max_restarts times; each restart resumes from the
  newest checkpoint on the volume.

With cluster.kubernetes.queue, Kueue admits the job: it carries the queue label and starts suspended.
"""

from __future__ import annotations

from typing import Any

from lmspec.compiler.emit.k8s.meta import metadata
from lmspec.compiler.emit.k8s.pod import container, pod_spec, template, training_gpus
from lmspec.compiler.emit.k8s.pod_sh import TRAIN, TRAINJOB, command
from lmspec.compiler.launchers.k8s.names import NODE, labels, object_name
from lmspec.compiler.plan import Plan

TRAINER_API = "trainer.kubeflow.org/v1alpha1"
JOBSET_API = "jobset.x-k8s.io/v1alpha2"
ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"  # Trainer finds its trainer's job by this label
TRAINER_ANCESTOR = "trainer"
FRAMEWORK_LABEL = "trainer.kubeflow.org/framework"


def training_objects(plan: Plan, files: dict[str, str]) -> list[dict[str, Any]]:
    """The objects of k8s/train.yaml, in the order kubectl applies them (a runtime before its TrainJob)."""
    if plan.spec.cluster.kubernetes.flavor == TRAINJOB:
        return [cluster_training_runtime(plan, files), train_job(plan)]
    return [jobset(plan, files)]


def runtime_name(plan: Plan) -> str:
    return f"{plan.spec.cluster.kubernetes.namespace}.{object_name(plan.spec)}"


def node_job(plan: Plan, files: dict[str, str]) -> dict[str, Any]:
    """The Indexed Job every node's pod belongs to: node rank = completion index, no retry of a single pod."""
    layout = plan.trained().layout
    node = container(plan, NODE, command(plan, TRAIN), training_gpus(plan), own_address=False)
    return {
        "parallelism": layout.nodes,
        "completions": layout.nodes,
        "completionMode": "Indexed",
        "backoffLimit": 0,
        "template": template(plan, {**pod_spec(plan, files, [node]), "restartPolicy": "Never"}),
    }


def jobset_spec(plan: Plan, files: dict[str, str], job_labels: dict[str, str]) -> dict[str, Any]:
    return {
        "network": {"enableDNSHostnames": True},
        "failurePolicy": {"maxRestarts": plan.spec.cluster.kubernetes.max_restarts},
        "replicatedJobs": [
            {
                "name": NODE,
                "replicas": 1,
                "template": {"metadata": {"labels": job_labels}, "spec": node_job(plan, files)},
            }
        ],
    }


def jobset(plan: Plan, files: dict[str, str]) -> dict[str, Any]:
    spec = jobset_spec(plan, files, labels(object_name(plan.spec)))
    return {
        "apiVersion": JOBSET_API,
        "kind": "JobSet",
        "metadata": metadata(plan),
        "spec": {**spec, **({"suspend": True} if plan.spec.cluster.kubernetes.queue else {})},
    }


def cluster_training_runtime(plan: Plan, files: dict[str, str]) -> dict[str, Any]:
    meta = metadata(plan, namespaced=False)
    return {
        "apiVersion": TRAINER_API,
        "kind": "ClusterTrainingRuntime",
        "metadata": {**meta, "name": runtime_name(plan), "labels": {**meta["labels"], FRAMEWORK_LABEL: "torch"}},
        "spec": {
            "mlPolicy": {"numNodes": plan.trained().layout.nodes, "torch": {}},
            "template": {"spec": jobset_spec(plan, files, {ANCESTOR_LABEL: TRAINER_ANCESTOR})},
        },
    }


def train_job(plan: Plan) -> dict[str, Any]:
    layout = plan.trained().layout
    spec: dict[str, Any] = {
        "runtimeRef": {
            "apiGroup": "trainer.kubeflow.org",
            "kind": "ClusterTrainingRuntime",
            "name": runtime_name(plan),
        },
        "trainer": {"numNodes": layout.nodes, "numProcPerNode": layout.gpus_per_node},
    }
    if plan.spec.cluster.kubernetes.queue:
        spec["suspend"] = True
    return {"apiVersion": TRAINER_API, "kind": "TrainJob", "metadata": metadata(plan), "spec": spec}
