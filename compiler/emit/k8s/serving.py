"""k8s/serve.yaml: the serving deployment, serve.replicas copies of the engine.

- serve_flavor leaderworkerset: a LeaderWorkerSet v0.10.0 of serve.replicas groups, each one engine of the
  serve layout's nodes (leaderWorkerTemplate.size): the leader runs `pod.sh serve-leader` (serve/head.sh, or
  serve/serve.sh for a one-node engine), the workers `pod.sh serve-worker` (serve/worker.sh with their
  LWS_WORKER_INDEX as node rank), in the spec's serve.multi_node mode. RecreateGroupOnPodRestart restarts a
  group whole (an engine cannot lose a node), and workers start with their leader (LeaderCreated: in mp and
  Ray modes the leader's server waits for them, so LeaderReady would never start them). A Service
  `<name>-leader` sends clients to every group's leader (worker index 0), which is ready once vLLM's /health
  answers.
- serve_flavor rayservice: a KubeRay RayService (lmspec.compiler.emit.k8s.ray_serve).
"""

from __future__ import annotations

from typing import Any

from lmspec.compiler.emit.k8s.meta import metadata
from lmspec.compiler.emit.k8s.pod import container, pod_spec, serving_gpus, template
from lmspec.compiler.emit.k8s.pod_sh import SERVE_LEADER, SERVE_WORKER, command
from lmspec.compiler.emit.k8s.ray_serve import ray_service
from lmspec.compiler.launchers.k8s.names import labels, leader_service, object_name
from lmspec.compiler.launchers.kubernetes import RAY_SERVE
from lmspec.compiler.plan import Plan

LWS_API = "leaderworkerset.x-k8s.io/v1"
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"  # on every pod of the set
LWS_WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"  # "0" on a leader
CONTAINER = "serve"
HTTP = "http"
HEALTH_PATH = "/health"
READINESS_PERIOD_S = 10


def serving_objects(plan: Plan, files: dict[str, str]) -> list[dict[str, Any]]:
    if plan.spec.cluster.kubernetes.serve_flavor == RAY_SERVE:
        return [ray_service(plan)]
    return [leader_worker_set(plan, files), leader_service_object(plan)]


def serve_pod(plan: Plan, files: dict[str, str], role: str) -> dict[str, Any]:
    """A leader's or a worker's pod template: pod.sh in `role`; the leader serves the API on serve.port."""
    v, nodes = plan.served().spec.serve, plan.served().layout.nodes
    leader = role == SERVE_LEADER
    node = container(plan, CONTAINER, command(plan, role), serving_gpus(plan), own_address=leader and nodes > 1)
    if leader:
        node["ports"] = [{"name": HTTP, "containerPort": v.port, "protocol": "TCP"}]
        node["readinessProbe"] = {"httpGet": {"path": HEALTH_PATH, "port": v.port}, "periodSeconds": READINESS_PERIOD_S}
    return template(plan, pod_spec(plan, files, [node]))


def leader_worker_set(plan: Plan, files: dict[str, str]) -> dict[str, Any]:
    nodes = plan.served().layout.nodes
    group: dict[str, Any] = {"size": nodes, "restartPolicy": "RecreateGroupOnPodRestart"}
    if nodes == 1:  # the leader alone, made from the worker template (LeaderWorkerSet requires that one)
        group["workerTemplate"] = serve_pod(plan, files, SERVE_LEADER)
    else:
        group["leaderTemplate"] = serve_pod(plan, files, SERVE_LEADER)
        group["workerTemplate"] = serve_pod(plan, files, SERVE_WORKER)
    return {
        "apiVersion": LWS_API,
        "kind": "LeaderWorkerSet",
        "metadata": metadata(plan),
        "spec": {"replicas": plan.served().spec.serve.replicas, "leaderWorkerTemplate": group},
    }


def leader_service_object(plan: Plan) -> dict[str, Any]:
    """A ClusterIP Service in front of every group's leader (LeaderWorkerSet's own headless Service has the
    set's name)."""
    name, port = object_name(plan.spec), plan.served().spec.serve.port
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": leader_service(name),
            "namespace": plan.spec.cluster.kubernetes.namespace,
            "labels": labels(name),
        },
        "spec": {
            "selector": {LWS_NAME_LABEL: name, LWS_WORKER_INDEX_LABEL: "0"},
            "ports": [{"name": HTTP, "port": port, "targetPort": port, "protocol": "TCP"}],
        },
    }
