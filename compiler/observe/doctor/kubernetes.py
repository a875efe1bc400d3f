"""What Kubernetes reports of a job's pods: killed for memory, evicted, an image it cannot pull, no node to
schedule on, or stopped before the trainer's checkpoint was saved; each named with the cluster.kubernetes keys
(and the others) that fix it.

A user saves what kubectl shows (`kubectl describe pods`, `kubectl get events`, `kubectl get pods`, `kubectl
logs`, the lines `lmspec run` prints) to a file and runs `lmspec doctor FILE`. Formats, from the sources:
- the container's end, `kubectl describe pod` (``Reason:       OOMKilled`` / ``Exit Code:    137`` under
  ``State:`` or ``Last State:      Terminated``), `kubectl get pod -o yaml` (``reason: OOMKilled``,
  ``exitCode: 137``), `kubectl get pods` (``OOMKilled`` in STATUS), and the kubelet's node event
  (pkg/kubelet/oom/oom_watcher_linux.go: ``System OOM encountered, victim process: python, pid: 4242``);
- eviction, the kubelet (pkg/kubelet/eviction/helpers.go): ``The node was low on resource: memory. Threshold
  quantity: 100Mi, available: 89744Ki. Container node was using 1523Gi, request is 0, has larger consumption of
  memory.`` (before v1.27: ``... which exceeds its request of 0.``), ``Pod ephemeral local storage usage exceeds
  the total limit of containers 10Gi.``, ``Usage of EmptyDir volume "dshm" exceeds the limit "64Gi".``, ``Container
  node exceeded its local ephemeral storage limit "20Gi".``; the pod's ``Reason:  Evicted``;
- image pulls, the kubelet (pkg/kubelet/images/image_manager.go): ``Failed to pull image "IMAGE": ERROR``,
  ``Back-off pulling image "IMAGE"``, ``Error: ErrImagePull``, ``Error: ImagePullBackOff``;
- scheduling, kube-scheduler (pkg/scheduler/framework/types.go FitError; the plugins' reasons): ``0/4 nodes are
  available: 4 Insufficient nvidia.com/gpu. preemption: 0/4 nodes are available: 4 No preemption victims found for
  incoming pod.``, ``2 node(s) had untolerated taint {nvidia.com/gpu: present}``, ``1 node(s) didn't match Pod's
  node affinity/selector``, ``pod has unbound immediate PersistentVolumeClaims``;
- a pod stopped: the kubelet's Killing event (pkg/kubelet/kuberuntime/kuberuntime_container.go: ``Stopping
  container node``), the scheduler's Preempted event (``Preempted by pod 6c5d... on node gpu-7``), k8s/pod.sh's
  own line when SIGTERM reaches a trainer's pod (templates/k8s_pod.sh.j2: ``pod.sh: SIGTERM: sending USR1 to the
  train processes``), and the trainer's
  ``lmspec: SIGUSR1 received: checkpointed at step 5; exit 3 (requeue)`` once the save committed.
"""

from __future__ import annotations

import math
import re

from lmspec.compiler.launchers.kubernetes import GRACE_KEY, GRACE_MARGIN, stop_time
from lmspec.compiler.models.units import GIB, MIB
from lmspec.compiler.observe.doctor.findings import Finding, Fix, Hit, LogText, Signature, Watch
from lmspec.compiler.observe.logs.context import RunContext
from lmspec.compiler.spec.sections.kubernetes import KubernetesSpec

_KEY = "cluster.kubernetes"
_OOM_KILLED = re.compile(r"\bOOMKilled\b")
_SYSTEM_OOM = re.compile(r"System OOM encountered(?:, victim process: (\S+?),)?")
_EXIT_137 = re.compile(r"\bExit Code:\s+137\b|\bexitCode\"?:\s*137\b")
_EVICTED = re.compile(
    r"The node was low on resource: ([\w.-]+)\."
    r"|(Pod ephemeral local storage usage exceeds the total limit of containers \S+)"
    r"|(Usage of EmptyDir volume \"[^\"]*\" exceeds the limit \"[^\"]*\")"
    r"|(Container \S+ exceeded its local ephemeral storage limit \"[^\"]*\")"
)
_PULL_FAILED = re.compile(r"Failed to pull image \"([^\"]+)\"(?::\s*(.*))?")  # with the registry's answer
_PULL_WAITING = re.compile(r"Back-off pulling image \"([^\"]+)\"|\b(?:ErrImagePull|ImagePullBackOff)\b")
# a registry that refused the credentials (or got none), not a missing tag
_DENIED = re.compile(
    r"unauthorized|authentication required|no basic auth credentials|pull access denied|denied|"
    r"\b401\b|\b403\b|forbidden",
    re.IGNORECASE | re.ASCII,
)
_UNSCHEDULABLE = re.compile(r"0/(\d+) nodes are available: (.*)")
_INSUFFICIENT = re.compile(r"(\d+) Insufficient ([\w./-]+)")
_TAINT = re.compile(r"(\d+) node\(s\) had (?:untolerated )?taints? \{([^:}]+): ?([^}]*)\}")
_SELECTOR = re.compile(r"(\d+) node\(s\) didn't match (?:Pod's )?node (?:affinity/)?selector")
_UNBOUND = re.compile(r"unbound immediate PersistentVolumeClaims|persistentvolumeclaim \"[^\"]+\" not found")
# a pod being stopped, as the cluster reports it: the kubelet's Killing event, the scheduler's preemption
_KILLING = re.compile(r"Stopping container (\S+)|Preempted by (?:pod )?\S+ on node (\S+)")
# ... and as the pod's console shows it: pod.sh's line when the kubelet's SIGTERM reaches a trainer's pod
# (templates/k8s_pod.sh.j2: 'pod.sh: SIGTERM: sending %s to the %s processes', USR1 to the train role; a server's
# pod is sent TERM and saves nothing)
_POD_STOP = re.compile(r"pod\.sh: SIGTERM: sending USR1 to the (\S+) processes")
_STOP_WATCHES = (
    Watch(_KILLING, (b"Stopping container ", b"Preempted by ")),
    Watch(_POD_STOP, (b"pod.sh: SIGTERM: sending USR1",), last_where=bool),
)
_EXIT_137_WATCH = Watch(_EXIT_137, (b"137",))
_OOM_WATCHES = (Watch(_OOM_KILLED, (b"OOMKilled",)), Watch(_SYSTEM_OOM, (b"System OOM encountered",)))
# a trainer's output: launch/torchrun.sh's lines, the trainer's step lines
_TRAINING = re.compile(r"torchrun\.sh: |^step\s+\d+ \| loss ")
_CHECKPOINTED = re.compile(r"received: checkpointed at step (\d+)")  # the trainer's line after its last save
# taints of the node's own state or role (not ready, unreachable, control plane): no job should tolerate them
_SYSTEM_TAINTS = ("node.kubernetes.io/", "node-role.kubernetes.io/")


def _kubernetes(context: RunContext | None) -> KubernetesSpec | None:
    return context.spec.cluster.kubernetes if context else None


def _hits(*found: list[Hit]) -> tuple[Hit, ...]:
    return tuple(hit for hits in found for hit in hits)


class PodOutOfMemory:
    """The container's cgroup (or the node) ran out of memory and the kernel's OOM killer ended it: Kubernetes
    reports OOMKilled, with exit code 137 (128 + SIGKILL). A bare 137 is SIGKILL from another hand too: the end
    of a grace period, which PodStoppedMidSave explains when the log shows the pod being stopped."""

    name = "k8s_oom_killed"
    watches = (
        *_OOM_WATCHES,
        _EXIT_137_WATCH,
        *_STOP_WATCHES,
    )

    def detect(self, log: LogText, context: RunContext | None) -> Finding | None:
        oom = _hits(log.find(_OOM_KILLED), log.find(_SYSTEM_OOM))
        stopped = log.find(_POD_STOP) or log.find(_KILLING)  # a grace period's SIGKILL: PodStoppedMidSave's
        killed = () if oom or stopped else _hits(log.find(_EXIT_137))
        if not oom and not killed:
            return None
        k8s = _kubernetes(context)
        fixes = []
        if k8s is None or k8s.memory is not None:
            fixes.append(
                Fix(
                    f"{_KEY}.memory",
                    f"<more than {k8s.memory}, up to a node's allocatable memory>" if k8s else "<more>",
                    "each pod's memory request and limit: past it the kernel kills the container",
                )
            )
        else:
            fixes.append(
                Fix(
                    f"{_KEY}.memory",
                    "<a node's allocatable memory (kubectl describe node)>",
                    "no request now: the scheduler reserved nothing, and the node ran out",
                )
            )
        parallel = context.spec.parallel if context else None
        if parallel is None or parallel.offload_optimizer:
            fixes.append(Fix("parallel.offload_optimizer", "false", "fp32 optimizer states held in host RAM"))
        if parallel is None or parallel.offload_params:
            fixes.append(Fix("parallel.offload_params", "false", "parameters offloaded to host RAM"))
        staged = ""
        if context is not None and context.trains:
            per_node = context.plan.trained().checkpoint.host_bytes_per_node
            staged = (
                f" A checkpoint save stages {_size(per_node)} of the step in each pod's host memory "
                "(lmspec's memory model, REPORT.md): a save is when the limit is most often crossed."
            )
        shm = f"{k8s.shm_gib} GiB" if k8s else "cluster.kubernetes.shm_gib"
        limit = (
            "The container used more memory than its limit (cluster.kubernetes.memory, the pod's request and limit), "
            "or the node ran out"
        )
        if oom:
            title, evidence = "pod out of memory (OOMKilled)", (*oom, *log.find(_EXIT_137))
            cause = (
                f"{limit}: the kernel's OOM killer ended it with SIGKILL (exit code 137). /dev/shm is memory-backed "
                f"({shm}) and what is written there counts too.{staged}"
            )
        else:
            title, evidence = "container killed (exit code 137)", killed
            cause = (
                "A container exited with code 137: SIGKILL (128 + 9), from the kernel's OOM killer (Kubernetes then "
                "says OOMKilled; `kubectl describe pod` or the node's journal shows it) or from the kubelet at the "
                f"end of a grace period. Most often: {limit[0].lower()}{limit[1:]}.{staged}"
            )
        return Finding(self.name, title, cause, tuple(e for e, _ in evidence), tuple(fixes))


class PodEvicted:
    """The kubelet evicted the pod: its node ran low on memory or disk, and the pods using the most above their
    requests go first."""

    name = "k8s_evicted"
    watches = (
        Watch(
            _EVICTED,
            (
                b"The node was low on resource: ",
                b"Pod ephemeral local storage usage exceeds",
                b"Usage of EmptyDir volume",
                b"exceeded its local ephemeral storage limit",
            ),
        ),
    )

    def detect(self, log: LogText, context: RunContext | None) -> Finding | None:
        hits = log.find(_EVICTED)
        if not hits:
            return None
        resources = {m.group(1) for _, m in hits if m.group(1)}
        local_storage = any(m.group(1) is None for _, m in hits) or bool(
            resources & {"ephemeral-storage", "nodefs", "imagefs"}
        )
        k8s = _kubernetes(context)
        fixes = []
        if local_storage:
            if k8s is None or k8s.volume_claim is None:
                fixes.append(
                    Fix(
                        f"{_KEY}.volume_claim",
                        "<a ReadWriteMany PersistentVolumeClaim>",
                        f"work_dir ({k8s.work_dir if k8s else 'runs/, checkpoints, data'}) is an emptyDir on the "
                        "node's disk now: checkpoints fill it",
                    )
                )
            fixes.append(
                Fix(
                    "train.checkpoint.keep_last_k",
                    "<fewer>",
                    "checkpoints kept on the pods' disk" + (f" (now {k8s.work_dir})" if k8s else ""),
                )
            )
        if resources & {"memory"} or not local_storage:
            fixes.append(
                Fix(
                    f"{_KEY}.memory",
                    f"<what a pod uses, now {k8s.memory}>" if k8s and k8s.memory else "<what a pod uses>",
                    "a request equal to the use (with cluster.kubernetes.cpus: Guaranteed QoS) is evicted last",
                )
            )
            fixes.append(
                Fix(
                    f"{_KEY}.shm_gib",
                    f"<less than {k8s.shm_gib}, if the loaders allow>" if k8s else "<less>",
                    "/dev/shm is memory-backed: what is written there is the node's memory",
                )
            )
        named = ", ".join(sorted(resources)) or "ephemeral storage"
        return Finding(
            self.name,
            f"pod evicted (node low on {named})",
            f"The kubelet evicted the pod because its node ran low on {named}: under node pressure the pods using "
            "the most above their requests go first, and an evicted pod is not restarted in place (the job "
            "restarts it elsewhere, from the newest checkpoint, while cluster.kubernetes.max_restarts allows).",
            tuple(e for e, _ in hits),
            tuple(fixes),
        )


class ImagePullFailure:
    """The kubelet cannot pull cluster.kubernetes.image: a name or tag that does not exist, or a registry that
    wants credentials the pod does not have."""

    name = "k8s_image_pull"
    watches = (
        Watch(_PULL_FAILED, (b"Failed to pull image ",)),
        Watch(_PULL_WAITING, (b"Back-off pulling image ", b"ErrImagePull", b"ImagePullBackOff")),
    )

    def detect(self, log: LogText, context: RunContext | None) -> Finding | None:
        failed, waiting = log.find(_PULL_FAILED), log.find(_PULL_WAITING)
        hits = [*failed, *waiting]
        if not hits:
            return None
        images = list(dict.fromkeys(m.group(1) for _, m in hits if m.group(1)))
        errors = [m.group(2) for _, m in failed if m.group(2)]
        denied = any(_DENIED.search(e) for e in errors)
        k8s = _kubernetes(context)
        image = images[0] if images else (k8s.image if k8s else None)
        fixes = [
            Fix(
                f"{_KEY}.image",
                "<an image and tag the registry holds>" + (f" (now {k8s.image})" if k8s else ""),
                "the pods' image: `docker manifest inspect IMAGE` (or crane, skopeo) says whether it exists",
            )
        ]
        secrets = Fix(
            f"{_KEY}.image_pull_secrets",
            "[<a docker-registry Secret in the namespace>]"
            + (f" (now {k8s.image_pull_secrets})" if k8s and k8s.image_pull_secrets else ""),
            "`kubectl create secret docker-registry NAME --docker-server=... -n NAMESPACE`: the registry's login",
        )
        fixes.insert(0 if denied else 1, secrets)
        shown = f"{image}" if image else "the image"
        why = (
            "the registry refused the credentials or got none (image_pull_secrets)"
            if denied
            else "the name or tag does not exist in the registry, or the registry wants credentials "
            "(the error after `Failed to pull image` says which)"
        )
        return Finding(
            self.name,
            "image pull failed (ErrImagePull / ImagePullBackOff)",
            f"The kubelet could not pull {shown} for the pods: {why}. The pods wait (ImagePullBackOff, retried "
            "up to every 5 minutes) and the job never starts.",
            tuple(e for e, _ in hits),
            tuple(fixes),
        )


class Unschedulable:
    """kube-scheduler finds no node for a pod: the GPUs (or RDMA devices, CPUs, memory) it asks for are not free
    on any node it may use, a taint it does not tolerate, a selector no node matches, or its claim unbound."""

    name = "k8s_failed_scheduling"
    watches = (Watch(_UNSCHEDULABLE, (b" nodes are available: ",)),)

    def detect(self, log: LogText, context: RunContext | None) -> Finding | None:
        hits = log.find(_UNSCHEDULABLE)
        if not hits:
            return None
        reasons = " ".join(m.group(2).split(" preemption: ")[0] for _, m in hits)
        insufficient = dict.fromkeys(m.group(2).rstrip(".") for m in _INSUFFICIENT.finditer(reasons))
        taints = dict.fromkeys(
            (m.group(2), m.group(3)) for m in _TAINT.finditer(reasons) if not m.group(2).startswith(_SYSTEM_TAINTS)
        )
        selector = _SELECTOR.search(reasons) is not None
        unbound = _UNBOUND.search(reasons) is not None
        k8s = _kubernetes(context)
        gpus = k8s.gpu_resource if k8s else None
        rdma = k8s.rdma_resource if k8s else None
        fixes: list[Fix] = []
        per_node = context.spec.hardware.gpus_per_node if context else None
        devices = False  # GPUs or RDMA devices short: the nodes that have them may be kept from the pods
        for resource in insufficient:
            if resource == gpus or (gpus is None and "gpu" in resource.lower()):
                devices = True
                fixes += [
                    Fix(
                        "hardware.gpus_per_node",
                        f"<at most a node's {resource}>" + (f" (now {per_node})" if per_node else ""),
                        f"each pod asks for gpus_per_node {resource}: no node has that many free",
                    ),
                    Fix(
                        f"{_KEY}.gpu_resource",
                        "<the resource the nodes' device plugin advertises>" + (f" (now {gpus})" if gpus else ""),
                        "`kubectl describe nodes` lists each node's Allocatable resources",
                    ),
                ]
            elif resource == rdma or (rdma is None and "rdma" in resource.lower()):
                devices = True
                fixes += [
                    Fix(
                        f"{_KEY}.rdma_resource",
                        "<the RDMA device plugin's resource, or null>" + (f" (now {rdma})" if rdma else ""),
                        "no node offers it: a wrong name, or a cluster without the RDMA device plugin",
                    ),
                    Fix(
                        f"{_KEY}.rdma_per_node",
                        f"<at most a node's {resource}>" + (f" (now {k8s.rdma_per_node})" if k8s else ""),
                        "how many each pod asks for",
                    ),
                ]
            elif resource == "cpu":
                fixes.append(
                    Fix(
                        f"{_KEY}.cpus",
                        "<at most a node's allocatable cpu>" + (f" (now {k8s.cpus})" if k8s else ""),
                        "each pod's CPU request",
                    )
                )
            elif resource == "memory":
                fixes.append(
                    Fix(
                        f"{_KEY}.memory",
                        "<at most a node's allocatable memory>" + (f" (now {k8s.memory})" if k8s else ""),
                        "each pod's memory request",
                    )
                )
        if devices and not taints:
            fixes += [
                Fix(
                    f"{_KEY}.node_selector",
                    "[<a label the GPU nodes carry, KEY=VALUE>]" + (f" (now {k8s.node_selector})" if k8s else ""),
                    "the pods may be kept off the nodes that have them",
                ),
                Fix(
                    f"{_KEY}.tolerations",
                    "[{key: <the GPU nodes' taint>, operator: Exists}]",
                    "GPU nodes are often tainted: a pod that does not tolerate the taint never lands there",
                ),
            ]
        for key, value in taints:
            fixes.append(
                Fix(
                    f"{_KEY}.tolerations",
                    f"[{{key: {key}, operator: Exists}}]",
                    f"the nodes are tainted {key}" + (f"={value}" if value else ""),
                )
            )
        if selector:
            fixes.append(
                Fix(
                    f"{_KEY}.node_selector",
                    "[<labels the nodes carry>]" + (f" (now {k8s.node_selector})" if k8s else ""),
                    "no node carries every label it asks for (`kubectl get nodes --show-labels`)",
                )
            )
        if unbound:
            fixes.append(
                Fix(
                    f"{_KEY}.volume_claim",
                    "<a PersistentVolumeClaim that exists and binds in the namespace>"
                    + (f" (now {k8s.volume_claim})" if k8s else ""),
                    "the pods wait for their claim",
                )
            )
        fixes = list({(f.key, f.value): f for f in fixes}.values())
        asked = ", ".join(insufficient) or "what they ask for"
        return Finding(
            self.name,
            "pods cannot be scheduled (FailedScheduling)",
            f"kube-scheduler found no node for the job's pods ({hits[0][1].group(1)} nodes looked at; short of "
            f"{asked}). The pods stay Pending, and a job of several nodes waits for all of them: each pod asks for "
            "hardware.gpus_per_node of cluster.kubernetes.gpu_resource (and rdma_per_node of rdma_resource) on one "
            "node, which other pods may hold too.",
            tuple(e for e, _ in hits),
            tuple(fixes),
        )


class PodStoppedMidSave:
    """The pod was stopped (deleted, evicted, preempted, its node drained) and the trainer did not commit its
    checkpoint before the grace period ended: the kubelet's SIGKILL cut the save, and the work since the last
    committed checkpoint is lost."""

    name = "k8s_stopped_mid_save"
    watches = (
        *_STOP_WATCHES,
        _EXIT_137_WATCH,
        *_OOM_WATCHES,
        Watch(_CHECKPOINTED, (b"received: checkpointed at step ",), keep=1, last_where=bool),
        Watch(_TRAINING, (b"torchrun.sh: ", b"| loss "), keep=1),
    )

    def detect(self, log: LogText, context: RunContext | None) -> Finding | None:
        if log.find(_OOM_KILLED) or log.find(_SYSTEM_OOM):
            return None  # the kernel's OOM killer ended it, not the grace period: PodOutOfMemory says so
        saved, console = log.last(_CHECKPOINTED), log.last(_POD_STOP)
        if console is not None:  # the console orders pod.sh's line and the trainer's: a save after the last stop?
            if saved is not None and saved[0].line > console[0].line:
                return None  # it committed: StoppedForRequeue says so
        elif not (log.find(_KILLING) and log.find(_TRAINING, limit=1)) or saved is not None:
            return None  # no trainer's pod stopped, or (events kept apart from the console) a save committed
        stops = log.find(_POD_STOP)
        if console is not None and console not in stops:
            stops = [*stops, console]
        evidence = [*stops, *(log.find(_KILLING) if log.find(_TRAINING, limit=1) else []), *log.find(_EXIT_137)]
        k8s = _kubernetes(context)
        grace = k8s.termination_grace_seconds if k8s else None
        fixes = _grace_fixes(context, grace)
        if context is not None and context.trains:
            fixes.append(
                Fix(
                    "train.checkpoint.interval",
                    str(max(context.training.train.checkpoint.interval // 2, 1)),
                    "less work lost when a stop comes before the save",
                )
            )
        return Finding(
            self.name,
            "pod stopped before its checkpoint was saved",
            "The pod was stopped (deleted, evicted, preempted, its node drained: the kubelet sends SIGTERM, which "
            "k8s/pod.sh turns into the trainer's checkpoint request) and no checkpoint was committed after it: "
            "the grace period ended first and SIGKILL (exit code 137) cut the step or the save. A save cut short "
            "is never used; the restarted pod resumes from the checkpoint before it"
            + (f" (grace period: {grace} s)." if grace else "."),
            tuple(e for e, _ in evidence),
            tuple(fixes),
        )


def _grace_fixes(context: RunContext | None, grace: int | None) -> list[Fix]:
    """The grace period the estimate of a stop advises (compiler/launchers/kubernetes.py stop_time); where the
    grace period already covers it, the stop took longer than estimated: a slower volume than the spec says."""
    stop = stop_time(context.training) if context is not None and context.trains else None
    why = "after SIGTERM the trainer finishes its step and saves before the kubelet's SIGKILL"
    if stop is None or grace is None:
        return [Fix(GRACE_KEY, "<longer than a step and a save>", why)]
    advised = math.ceil(stop.total_s * GRACE_MARGIN)
    if advised > grace:
        return [
            Fix(GRACE_KEY, str(advised), f"{why} (estimated {_seconds(stop.total_s)}, and half again; now {grace} s)")
        ]
    storage = context.spec.cluster.storage_write_gb_per_s if context is not None else None
    return [
        Fix(
            GRACE_KEY,
            f"<longer than {grace}>",
            f"{why}; this stop took longer than the {_seconds(stop.total_s)} estimated",
        ),
        Fix(
            "cluster.storage_write_gb_per_s",
            f"<what the pods' volume sustains, now {storage:g}>",
            "a save is priced at this write rate: a slower volume makes it outlast the estimate and the grace period",
        ),
    ]


def _seconds(value: float) -> str:
    return f"{value:,.0f} s" if value >= 10 else f"{value:.2g} s"


def _size(count: int) -> str:
    return f"{count / GIB:,.1f} GiB" if count >= GIB // 10 else f"{count / MIB:,.0f} MiB"


# the kubernetes launcher's own signatures (lmspec.compiler.launchers.kubernetes names this module), in the
# doctor's table order
SIGNATURES: tuple[Signature, ...] = (
    PodStoppedMidSave(),
    PodOutOfMemory(),
    PodEvicted(),
    ImagePullFailure(),
    Unschedulable(),
)
