"""An object's metadata: the job's name, namespace and labels, and Kueue's queue label on what Kueue admits."""

from __future__ import annotations

from typing import Any

from lmspec.compiler.launchers.k8s.names import QUEUE_LABEL, labels, object_name
from lmspec.compiler.plan import Plan


def metadata(plan: Plan, namespaced: bool = True) -> dict[str, Any]:
    """The top object's metadata; a cluster-scoped one (`namespaced` False) has no namespace and is not queued."""
    k, name = plan.spec.cluster.kubernetes, object_name(plan.spec)
    queue = {QUEUE_LABEL: k.queue} if k.queue and namespaced else {}
    return {"name": name, **({"namespace": k.namespace} if namespaced else {}), "labels": {**labels(name), **queue}}
