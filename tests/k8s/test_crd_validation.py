"""Kubernetes objects, proven offline (issue 43, item 3): the strict validator catches each kind of mistake the API
server refuses, on small hand-written objects, and every object lmspec compiles for Kubernetes passes it.

The CRDs come from ../shared/k8s-crds (upstream data beside the project): without them every test here skips.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from helpers.k8s_schema import KUBERNETES_VERSION, documents, needs_crds, problems
from helpers.specs import ON_KUBERNETES

from lmspec.compiler.build.files import K8S_BUILD, K8S_SERVE, K8S_TRAIN
from lmspec.compiler.emit.manifest import build_files
from lmspec.compiler.pipeline import make_plan

pytestmark = needs_crds

TRAINER = "trainer.kubeflow.org/v1alpha1"
CONTAINER = {
    "name": "node",
    "image": "registry.example/lmspec:1",
    "command": ["bash", "/lmspec/build/k8s/pod.sh", "train"],
    "env": [{"name": "LMSPEC_ROLE", "value": "train"}],
    "resources": {"limits": {"nvidia.com/gpu": 8, "memory": "64Gi"}},
    "ports": [{"containerPort": 29500}],
    "securityContext": {"capabilities": {"add": ["IPC_LOCK"]}},
    "volumeMounts": [{"name": "shm", "mountPath": "/dev/shm"}],
}
POD = {
    "restartPolicy": "Never",
    "containers": [CONTAINER],
    "volumes": [{"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}}],
}
JOBSET_SPEC = {
    "network": {"enableDNSHostnames": True},  # its immutability rule reads oldSelf: not run on create
    "failurePolicy": {"maxRestarts": 3},
    "replicatedJobs": [
        {
            "name": "node",
            "replicas": 1,
            "template": {
                "spec": {
                    "parallelism": 2,
                    "completions": 2,
                    "backoffLimit": 0,
                    "completionMode": "Indexed",
                    "template": {"metadata": {"labels": {"app": "tiny"}}, "spec": POD},
                }
            },
        }
    ],
}
OBJECTS: dict[str, dict[str, Any]] = {
    "TrainJob": {
        "apiVersion": TRAINER,
        "kind": "TrainJob",
        "metadata": {"name": "tiny", "namespace": "ml", "labels": {"kueue.x-k8s.io/queue-name": "gpus"}},
        "spec": {
            "runtimeRef": {"name": "tiny", "kind": "ClusterTrainingRuntime"},
            "trainer": {"numNodes": 2, "numProcPerNode": 8},
            "suspend": True,
        },
    },
    "ClusterTrainingRuntime": {
        "apiVersion": TRAINER,
        "kind": "ClusterTrainingRuntime",
        "metadata": {"name": "tiny"},
        # Trainer v2.3.0's torch policy has no numProcPerNode (a TrainJob's spec.trainer.numProcPerNode sets it)
        "spec": {"mlPolicy": {"numNodes": 2, "torch": {}}, "template": {"spec": JOBSET_SPEC}},
    },
    "JobSet": {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "tiny", "namespace": "ml"},
        "spec": JOBSET_SPEC,
    },
    "LeaderWorkerSet": {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": "tiny-serve"},
        "spec": {
            "replicas": 1,
            "leaderWorkerTemplate": {
                "size": 2,
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": {"spec": POD},
                "workerTemplate": {"spec": POD},
            },
        },
    },
    "RayService": {
        "apiVersion": "ray.io/v1",
        "kind": "RayService",
        "metadata": {"name": "tiny-serve"},
        "spec": {
            "serveConfigV2": "applications: []\n",
            "rayClusterConfig": {
                "headGroupSpec": {"rayStartParams": {}, "template": {"spec": {"containers": [CONTAINER]}}},
                "workerGroupSpecs": [
                    {
                        "groupName": "gpu",
                        "replicas": 1,
                        "rayStartParams": {},
                        "template": {"spec": {"containers": [CONTAINER]}},
                    }
                ],
            },
        },
    },
    "Service": {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "tiny-serve-leader"},
        "spec": {"selector": {"app": "tiny"}, "ports": [{"name": "http", "port": 8000, "targetPort": 8000}]},
    },
    "ConfigMap": {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "tiny-build"},
        "data": {"k8s.pod.sh": "#!/usr/bin/env bash\n", "manifest.json": "{}\n"},
    },
}


def edited(kind: str, path: str, value: Any) -> dict[str, Any]:
    """A copy of OBJECTS[kind] with the dotted `path` (list indexes as numbers) set to `value`."""
    obj = copy.deepcopy(OBJECTS[kind])
    *parents, last = path.split(".")
    node: Any = obj
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    node[int(last) if isinstance(node, list) else last] = value
    return obj


@pytest.mark.parametrize("kind", sorted(OBJECTS))
def test_hand_written_objects_pass(kind: str) -> None:
    """The controls: each object the mistakes below are made in is valid as written (transition rules such as
    JobSet's `self == oldSelf` on network and failurePolicy are not run on create)."""
    assert problems(OBJECTS[kind]) == []


def test_stale_field_podTemplateOverrides_is_refused() -> None:
    """Trainer v2.2.0 replaced TrainJob's podTemplateOverrides with runtimePatches: the v2.3.0 CRD refuses it,
    and kubeflow-trainer-api's model drops it (its round trip reports that too)."""
    stale = [{"targetJobs": [{"name": "node"}], "spec": {"nodeSelector": {"pool": "h100"}}}]
    found = problems(edited("TrainJob", "spec.podTemplateOverrides", stale))
    assert (
        "TrainJob/tiny: $.spec: Additional properties are not allowed ('podTemplateOverrides' was unexpected)" in found
    )
    assert any("$.spec.podTemplateOverrides: dropped" in problem for problem in found), found


def test_wrong_enum_is_refused() -> None:
    """LeaderWorkerSet's restartPolicy is Default, RecreateGroupOnPodRestart, RecreateGroupAfterStart or None."""
    found = problems(edited("LeaderWorkerSet", "spec.leaderWorkerTemplate.restartPolicy", "Always"))
    assert found == [
        "LeaderWorkerSet/tiny-serve: $.spec.leaderWorkerTemplate.restartPolicy: 'Always' is not one of "
        "['Default', 'RecreateGroupOnPodRestart', 'RecreateGroupAfterStart', 'None']"
    ]


def test_wrong_type_is_refused() -> None:
    """A string where the Job's parallelism (an int32) belongs: the CRD's schema, the core Job template schema and
    the JobSet model each refuse it."""
    found = problems(edited("JobSet", "spec.replicatedJobs.0.template.spec.parallelism", "2"))
    parallelism = "$.spec.replicatedJobs[0].template.spec.parallelism"
    assert f"JobSet/tiny: {parallelism}: '2' is not of type 'integer'" in found
    assert (
        f"JobSet/tiny: {parallelism}: '2' is not of type 'integer', 'null' (Kubernetes {KUBERNETES_VERSION})" in found
    )
    assert any("kubeflow-trainer-api JobsetV1alpha2JobSet refuses it" in problem for problem in found), found


@pytest.mark.parametrize(
    ("kind", "path", "value", "message"),
    [
        pytest.param(
            "TrainJob", "metadata.name", "1tiny", "$: metadata.name must match RFC 1035 DNS label format", id="name"
        ),
        pytest.param(
            "ClusterTrainingRuntime",
            "spec.mlPolicy.mpi",
            {"numProcPerNode": 8},
            "$.spec.mlPolicy: Only one of the policy can be configured",
            id="ml-policy",
        ),
        pytest.param(
            "JobSet",
            "spec.startupPolicy",
            {"startupPolicyOrder": "InOrder"},
            "$.spec: StartupPolicy and DependsOn APIs are mutually exclusive",
            id="startup-order",
        ),
    ],
)
def test_cel_rule_violation_is_refused(kind: str, path: str, value: Any, message: str) -> None:
    """Each object passes the schema and breaks one x-kubernetes-validations rule of its CRD: "1tiny" is a valid
    object name (DNS subdomain) but not the RFC 1035 label a TrainJob's rule asks for; a runtime with two ML
    policies; a JobSet started in order whose jobs depend on each other."""
    obj = edited(kind, path, value)
    if kind == "JobSet":
        obj["spec"]["replicatedJobs"].insert(0, {**obj["spec"]["replicatedJobs"][0], "name": "init"})
        obj["spec"]["replicatedJobs"][1]["dependsOn"] = [{"name": "init", "status": "Complete"}]
    found = problems(obj)
    assert len(found) == 1 and found[0].startswith(f"{kind}/{obj['metadata']['name']}: {message} ("), found


def test_unserved_version_is_refused() -> None:
    found = problems(edited("TrainJob", "apiVersion", "trainer.kubeflow.org/v1"))
    assert found == [
        "TrainJob/tiny: $.apiVersion: v1 is not a served version of trainjobs.trainer.kubeflow.org "
        "(served: ['v1alpha1'])"
    ]


def test_namespace_of_a_cluster_scoped_object_is_refused() -> None:
    found = problems(edited("ClusterTrainingRuntime", "metadata.namespace", "ml"))
    assert found == [
        "ClusterTrainingRuntime/tiny: $.metadata.namespace: not allowed: "
        "clustertrainingruntimes.trainer.kubeflow.org is cluster-scoped"
    ]


def test_pod_template_is_checked_against_the_cluster_version() -> None:
    """JobSet v0.12.0's CRD embeds a newer PodSpec (hostnameOverride) than Kubernetes 1.33 has: the CRD accepts
    the field, the pinned cluster's strict schema does not."""
    pod = {**POD, "hostnameOverride": "node"}
    found = problems(edited("JobSet", "spec.replicatedJobs.0.template.spec.template.spec", pod))
    assert found == [
        "JobSet/tiny: $.spec.replicatedJobs[0].template.spec.template.spec: Additional properties are not allowed "
        f"('hostnameOverride' was unexpected) (Kubernetes {KUBERNETES_VERSION})"
    ]


def test_repeated_list_map_key_is_refused() -> None:
    env = [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]
    found = problems(edited("JobSet", "spec.replicatedJobs.0.template.spec.template.spec.containers.0.env", env))
    assert any('containers[0].env[1]: duplicate ["A"] in a list of type map' in problem for problem in found), found


@pytest.mark.parametrize(
    ("kind", "path", "value", "message"),
    [
        pytest.param(
            "Service",
            "spec.ports.0.port",
            "8000",
            "Service/tiny-serve-leader: $.spec.ports[0].port: '8000' is not of type 'integer'",
            id="service-port",
        ),
        pytest.param(
            "Service",
            "spec.leader",
            True,
            "Service/tiny-serve-leader: $.spec: Additional properties are not allowed ('leader' was unexpected)",
            id="service-unknown-field",
        ),
        pytest.param(
            "ConfigMap",
            "data",
            {"k8s/pod.sh": ""},
            "ConfigMap/tiny-build: $.data: key 'k8s/pod.sh' is not a ConfigMap key ([-._a-zA-Z0-9]+)",
            id="configmap-key",
        ),
        pytest.param(
            "ConfigMap",
            "data",
            {"big": "x" * (1024 * 1024 + 1)},
            "ConfigMap/tiny-build: $: the ConfigMap holds 1048577 bytes, over the server's 1048576",
            id="configmap-size",
        ),
        pytest.param(
            "ConfigMap",
            "metadata.labels",
            {"app": "tiny build"},
            "ConfigMap/tiny-build: $.metadata.labels.app: 'tiny build' is not a label value",
            id="label-value",
        ),
    ],
)
def test_core_kind_mistakes_are_refused(kind: str, path: str, value: Any, message: str) -> None:
    assert message in problems(edited(kind, path, value))


# -- what lmspec compiles -----------------------------------------------------------------------------------------

DEEPSEEK = "deepseek_v2_lite_pretrain_32gpu_h100_k8s"  # 4 nodes of 8 H100
LLAMA_SERVE = "llama3_70b_serve_16gpu_h100_k8s"  # one engine on 2 nodes
TRAINJOB = {K8S_TRAIN: ["ClusterTrainingRuntime", "TrainJob"], K8S_BUILD: ["ConfigMap"]}
BUILDS = [
    pytest.param(DEEPSEEK, [], TRAINJOB, id="deepseek-trainjob"),
    pytest.param(
        DEEPSEEK,
        ["cluster.kubernetes.flavor=jobset"],
        {K8S_TRAIN: ["JobSet"], K8S_BUILD: ["ConfigMap"]},
        id="deepseek-jobset",
    ),
    pytest.param(
        LLAMA_SERVE,
        [],
        {K8S_SERVE: ["LeaderWorkerSet", "Service"], K8S_BUILD: ["ConfigMap"]},
        id="llama-leaderworkerset",
    ),
    pytest.param(
        LLAMA_SERVE,
        ["cluster.kubernetes.serve_flavor=rayservice", "serve.api_key_env=null"],  # the Ray app checks no key
        {K8S_SERVE: ["RayService"], K8S_BUILD: ["ConfigMap"]},
        id="llama-rayservice",
    ),
    pytest.param(
        None,  # the built-in spec trains and serves
        list(ON_KUBERNETES),
        {**TRAINJOB, K8S_SERVE: ["LeaderWorkerSet", "Service"]},
        id="tiny",
    ),
]


@pytest.mark.parametrize(("spec", "overrides", "kinds"), BUILDS)
def test_compiled_objects_pass_every_check(spec: str | None, overrides: list[str], kinds: dict[str, list[str]]) -> None:
    """Every object of every Kubernetes file of the build passes the CRD schema, its CEL rules, the core schemas
    and the Trainer models; each expected file holds the expected kinds (others the spec has are checked too)."""
    files = build_files(make_plan(overrides, Path(spec) if spec else None))
    manifests = {
        path: documents(text) for path, text in files.items() if path.startswith("k8s/") and path.endswith(".yaml")
    }
    for path, expected in kinds.items():
        assert path in manifests, f"{path} missing from the build: {sorted(files)}"
        assert sorted({obj["kind"] for obj in manifests[path]}) == expected, path
    found = [
        f"{path}: {problem}" for path, objects in manifests.items() for obj in objects for problem in problems(obj)
    ]
    assert found == []
