"""cluster.launcher=kubernetes' own files: k8s/pod.sh, and the objects of the parts the spec has.

- k8s/pod.sh (pod_sh): every container's command;
- k8s/train.yaml (training) when the spec trains: a TrainJob and its ClusterTrainingRuntime, or a JobSet;
- k8s/serve.yaml (serving) when it serves: a LeaderWorkerSet and its leader Service, or a RayService.

The objects are plain dicts (pod: the pod they share; meta: their metadata) written by
lmspec.compiler.launchers.k8s.yaml_text; the build ConfigMaps (k8s/build.yaml) are the launcher's carried file
(lmspec.compiler.launchers.k8s.build_config), which the pods' projected volume lists item by item, so these
are made last, from the build's other files (the launcher's `files`). Every field name, type and enum is the
CRDs' of the controllers' pinned versions (../shared/k8s-crds/; tests/k8s/ validates them strictly).
"""

from __future__ import annotations

from lmspec.compiler.build.files import K8S_POD_SH, K8S_SERVE, K8S_TRAIN
from lmspec.compiler.emit.k8s.pod_sh import pod_sh, roles
from lmspec.compiler.emit.k8s.serving import serving_objects
from lmspec.compiler.emit.k8s.training import training_objects
from lmspec.compiler.launchers.k8s.yaml_text import dump_objects
from lmspec.compiler.launchers.kubernetes import RAY_SERVE
from lmspec.compiler.plan import Plan


def emit_kubernetes(plan: Plan, files: dict[str, str]) -> dict[str, str]:
    """pod.sh and the job files, given every other file of the build (what the pods mount)."""
    lws = plan.serve is not None and plan.spec.cluster.kubernetes.serve_flavor != RAY_SERVE
    emitted = {K8S_POD_SH: pod_sh(plan, lws)} if roles(plan, lws) else {}  # a RayService alone runs none
    mounted = {**files, **emitted}
    if plan.train is not None:
        emitted[K8S_TRAIN] = dump_objects(training_objects(plan, mounted))
    if plan.serve is not None:
        emitted[K8S_SERVE] = dump_objects(serving_objects(plan, mounted))
    return emitted
