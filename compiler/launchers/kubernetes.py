"""cluster.launcher=kubernetes: the job as Kubernetes objects, applied with kubectl and run by their controllers.

Training is a Kubeflow Trainer v2 TrainJob on a ClusterTrainingRuntime lmspec emits, or a JobSet
(cluster.kubernetes.flavor); serving a LeaderWorkerSet with a Service in front of its leaders, or a KubeRay
RayService (serve_flavor); a ConfigMap carries the build into every pod (lmspec.compiler.launchers.k8s), whose
container runs k8s/pod.sh (lmspec.compiler.emit.k8s). `lmspec run` applies them
(lmspec.runtime.launchers.kubernetes). The kubelet's SIGTERM (eviction, preemption, deletion) reaches pod.sh,
which sends USR1 to the trainer's process group as sbatch.sh forwards Slurm's: the trainer finishes its step,
saves and exits, within terminationGracePeriodSeconds (`grace_covers_a_stop`); the controller restarts the job,
which resumes from the volume.

The rules judge cluster.kubernetes only when it is the spec's launcher: its values name objects of a cluster a
spec compiled for another launcher never reaches. They restate what the API server, the controllers' webhooks
and their CRDs' CEL rules would refuse only at `kubectl apply` (names, LeaderWorkerSet's replica bounds), and
what would fail inside a pod (no image, the API key's variable, a loopback server). The spec's sections
import this registry, so the rules import the sections and the models they price with when they run.
"""

from __future__ import annotations

import math
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lmspec.compiler.build.files import K8S_BUILD, K8S_SERVE
from lmspec.compiler.endpoint import loopback
from lmspec.compiler.errors import Problem, error
from lmspec.compiler.launchers.container import setup_runs_in_the_image
from lmspec.compiler.launchers.k8s.build_config import build_config_maps
from lmspec.compiler.launchers.k8s.names import (
    POD_IP_ENV,
    RFC_1035_LABEL,
    built_names,
    leader_service,
    object_name,
    suggested_name,
)
from lmspec.compiler.launchers.launcher import Launcher
from lmspec.compiler.models.units import GB

if TYPE_CHECKING:
    from lmspec.compiler.plan import Plan
    from lmspec.compiler.rules.context import RuleContext, TrainingContext
    from lmspec.compiler.spec.sections import Spec, TrainingSpec

NAME = "kubernetes"
NAME_KEY = "cluster.kubernetes.name"
GRACE_KEY = "cluster.kubernetes.termination_grace_seconds"
FLAVOR_KEY = "cluster.kubernetes.serve_flavor"
RAY_SERVE = "rayservice"
GRACE_MARGIN = 1.5  # the advised grace period: the estimate and half again, for the estimate's error
# LeaderWorkerSet v0.10.0's webhook (pkg/webhooks/leaderworkerset_webhook.go generalValidate): replicas at most
# a million, replicas x size within an int32. size >= 1 holds by construction (serving nodes), and lmspec sets
# no subGroupPolicy (whose subGroupSize must divide size or size - 1).
LWS_REPLICAS_MAX = 1_000_000
INT32_MAX = 2**31 - 1


def chosen(spec: Spec) -> bool:
    """Whether this is the spec's launcher: only then are cluster.kubernetes' values judged."""
    return spec.cluster.launcher == NAME


def image_required(ctx: RuleContext) -> Iterator[Problem]:
    if chosen(ctx.spec) and ctx.spec.cluster.kubernetes.image is None:
        yield error(
            "cluster.kubernetes.image",
            (
                f"{ctx.show('cluster.kubernetes.image')} with {ctx.show('cluster.launcher')}: every pod runs this "
                "image, and it must hold lmspec with its training or serving stack (torch, megatron-core or "
                "DeepSpeed, vLLM); set cluster.kubernetes.image, e.g. "
                "cluster.kubernetes.image=ghcr.io/my-team/lmspec:0.1"
            ),
        )


def setup_outside_the_image(ctx: RuleContext) -> Iterator[Problem]:
    image = ctx.spec.cluster.kubernetes.image
    if chosen(ctx.spec) and image is not None:
        yield from setup_runs_in_the_image(ctx, "cluster.kubernetes.image", image)


def object_names_fit(ctx: RuleContext) -> Iterator[Problem]:
    """The objects' name is an RFC 1035 label (TrainJob's CEL rule, LeaderWorkerSet's and KubeRay's webhooks:
    each names a Service after it), and every name the controllers make of it fits (k8s.names)."""
    from lmspec.compiler.spec.sections import serving, training

    spec = ctx.spec
    if not chosen(spec):
        return
    name = object_name(spec)
    shown = ctx.show(NAME_KEY) + ("" if spec.cluster.kubernetes.name else f", so the spec's name {name!r}")
    if not RFC_1035_LABEL.fullmatch(name):
        yield error(
            NAME_KEY,
            (
                f"{shown} is not an RFC 1035 label (a lowercase letter first, then lowercase letters, digits and -, "
                "not ending in -): the controllers name Services after it; set "
                f"{NAME_KEY}={suggested_name(name, len(name))}"
            ),
        )
        return
    serves = serving(spec)
    built = built_names(
        name,
        spec.hardware.nodes if training(spec) is not None else None,
        serves.serve.replicas if serves is not None else None,
        spec.cluster.kubernetes.serve_flavor == RAY_SERVE,
    )
    over = [b for b in built if b.over > 0]
    if over:
        worst = max(over, key=lambda b: b.over)
        length = len(name) - worst.over
        yield error(
            NAME_KEY,
            (
                f"{shown} is too long: {worst.what} would be {worst.text!r}, {len(worst.text)} characters, and the "
                f"API server refuses it past {worst.limit}; set {NAME_KEY} to at most {length} characters, e.g. "
                f"{NAME_KEY}={suggested_name(name, length)}"
            ),
        )


def environment_names(ctx: RuleContext) -> Iterator[Problem]:
    """Each variable of the pods' env is set once (server-side apply refuses a list-map key twice), and the API
    key serving reads (serve.api_key_env) is one of them: without it the server refuses to start, and a pod
    has no shell a user could export it in (on a machine, the default spec's key comes from the user's shell)."""
    from lmspec.compiler.spec.sections import serving

    spec = ctx.spec
    if not chosen(spec):
        return
    k = spec.cluster.kubernetes
    names = [assignment.partition("=")[0] for assignment in spec.cluster.env] + [s.name for s in k.secret_env]
    twice = sorted({n for n in names if names.count(n) > 1} | ({POD_IP_ENV} & set(names)))
    if twice:
        yield error(
            "cluster.kubernetes.secret_env",
            (
                f"{', '.join(twice)} set more than once in the pods' environment ({ctx.show('cluster.env')}, "
                f"{ctx.show('cluster.kubernetes.secret_env')}; pod.sh's own: {POD_IP_ENV}): keep one of each"
            ),
        )
    serves = serving(spec)
    key_env = serves.serve.api_key_env if serves is not None else None
    if key_env is not None and key_env not in names:
        yield error(
            "serve.api_key_env",
            (
                f"{ctx.show('serve.api_key_env')} names a variable no pod has, so the server will not start: add it "
                "from a Secret, "
                f"cluster.kubernetes.secret_env=[{{name: {key_env}, secret: SECRET, key: KEY}}] (kubectl create secret "
                f"generic SECRET --from-literal=KEY=...), or serve without a key: serve.api_key_env=null"
            ),
        )


def serving_reachable(ctx: RuleContext) -> Iterator[Problem]:
    """Clients reach the engine through a Service at the pod's own address, and the readiness probe asks there
    too, which a loopback server never answers: the pod would never be ready, the Service never have an endpoint
    (an engine on several nodes is refused by the serving rules already)."""
    from lmspec.compiler.spec.sections import serving

    serves = serving(ctx.spec)
    if chosen(ctx.spec) and serves is not None and loopback(serves.serve.host):
        yield error(
            "serve.host",
            (
                f"{ctx.show('serve.host')} is a loopback address: the leader Service and its readiness probe reach "
                "the pod at its own address, so the pod would never be ready and the Service never answer; set "
                "serve.host=0.0.0.0"
            ),
        )


def leaderworkerset_bounds(ctx: RuleContext) -> Iterator[Problem]:
    """LeaderWorkerSet's webhook bounds on its replicas (serve.replicas), which its CRD does not state."""
    from lmspec.compiler.models.serve_layout import serve_layout
    from lmspec.compiler.spec.sections import serving

    serves = serving(ctx.spec)
    if not chosen(ctx.spec) or serves is None or ctx.spec.cluster.kubernetes.serve_flavor == RAY_SERVE:
        return
    replicas, size = serves.serve.replicas, serve_layout(serves).nodes
    if replicas > LWS_REPLICAS_MAX or replicas * size > INT32_MAX:
        most = min(LWS_REPLICAS_MAX, INT32_MAX // size)
        yield error(
            "serve.replicas",
            (
                f"{ctx.show('serve.replicas')} of {size} pod(s) each: LeaderWorkerSet's webhook refuses more than "
                f"{LWS_REPLICAS_MAX:,} replicas or {INT32_MAX:,} pods; set serve.replicas={most} or fewer"
            ),
        )


def ray_serve_expressible(ctx: RuleContext) -> Iterator[Problem]:
    """What Ray Serve's OpenAI app (ray.serve.llm build_openai_app: one vLLM engine of tp x pp GPUs per replica)
    cannot run, each with the key to change."""
    from lmspec.compiler.models.dims import device_kind
    from lmspec.compiler.spec.sections import serving

    spec, serves = ctx.spec, serving(ctx.spec)
    if not chosen(spec) or serves is None or spec.cluster.kubernetes.serve_flavor != RAY_SERVE:
        return
    v = serves.serve
    instead = f"or serve as a LeaderWorkerSet: {FLAVOR_KEY}=leaderworkerset"
    refused = [
        (
            v.disaggregation is not None,
            "serve.disaggregation",
            "its prefill and decode pools need Ray Serve's own disaggregated app, which lmspec does not emit; "
            f"set serve.disaggregation=null, {instead}",
        ),
        (
            v.dp > 1,
            "serve.dp",
            "the app runs one engine of tensor x pipeline parallel ranks per replica and places no data-parallel "
            f"ranks; set serve.dp=1 and serve.replicas for copies, {instead}",
        ),
        (
            v.api_key_env is not None,
            "serve.api_key_env",
            "the app checks no API key, so anyone reaching its Service would use the model; set "
            f"serve.api_key_env=null and restrict access to the Service, {instead}",
        ),
        (
            device_kind(serves) == "cpu",
            FLAVOR_KEY,
            "the app places every vLLM worker on a GPU, and this hardware has none; set "
            f"{FLAVOR_KEY}=leaderworkerset (vLLM's CPU engine)",
        ),
    ]
    for failed, key, why in refused:
        if failed:
            yield error(key, f"{ctx.show(key)} with {ctx.show(FLAVOR_KEY)}: {why}")


def rack_nvlink_needs_imex(ctx: RuleContext) -> Iterator[Problem]:
    """Ranks on several hosts of an NVLink rack (GB200 NVL72) talk over multi-node NVLink only through an IMEX
    channel in every pod, which NVIDIA's DRA driver grants through a ComputeDomain claim; lmspec's objects do not
    claim one, and nccl.env's NCCL_MNNVL_ENABLE=1 stops NCCL at init without it (compiler/emit/rack.py)."""
    from lmspec.compiler.models.dims import nodes_per_domain

    hw = ctx.spec.hardware
    if not chosen(ctx.spec) or hw.nodes == 1 or nodes_per_domain(hw.gpus_per_node, hw.nvlink_domain) == 1:
        return
    yield error(
        "hardware.nvlink_domain",
        (
            f"{ctx.show('hardware.nvlink_domain')} joins hosts over NVLink, which a pod reaches only through an "
            "IMEX channel that NVIDIA's DRA driver grants with a ComputeDomain claim; lmspec's Kubernetes "
            "objects claim none, and NCCL would stop at init; use cluster=slurm (Slurm's switch/nvidia_imex "
            "gives the job its channel), or hardware.nvlink_domain=null to run the hosts over the network"
        ),
    )


def grace_covers_a_stop(ctx: TrainingContext) -> Iterator[Problem]:
    """terminationGracePeriodSeconds covers what the trainer does after SIGTERM: finish the step in progress
    (the step-time model's estimate), wait for an asynchronous save still persisting, and save synchronously
    (staging and persist: compiler/models/checkpoint_size.py); past it the kubelet kills the pod mid-save and
    the restarted job resumes from the save before."""
    stop = stop_time(ctx.spec)
    if stop is None or ctx.spec.cluster.kubernetes.termination_grace_seconds >= stop.total_s:
        return
    waits = f"an asynchronous save still persisting ({stop.in_flight_s:,.0f} s), " if stop.in_flight_s else ""
    yield error(
        GRACE_KEY,
        (
            f"{ctx.show(GRACE_KEY)} is shorter than the {stop.total_s:,.0f} s a stop takes after SIGTERM: the step "
            f"in progress ({stop.step_s:,.3g} s, estimated), {waits}then a save of {stop.save_bytes / GB:,.1f} GB "
            f"staged in {stop.staging_s:,.1f} s and written in {stop.persist_s:,.0f} s at "
            f"{ctx.show('cluster.storage_write_gb_per_s')}; the kubelet would kill the pods mid-save. Set "
            f"{GRACE_KEY}={math.ceil(stop.total_s * GRACE_MARGIN)} (the estimate and half again), or put the "
            "checkpoints on faster storage and set cluster.storage_write_gb_per_s to what it sustains"
        ),
    )


@dataclass(frozen=True)
class StopTime:
    """What the trainer does between SIGTERM and its exit, in seconds (REPORT.md shows it beside the grace)."""

    step_s: float  # the step in progress: the step-time model's estimate (compiler/models/steptime.py)
    in_flight_s: float  # an asynchronous save's persist still running (0 for synchronous saves)
    staging_s: float  # the final save, synchronous: staging ... (compiler/models/checkpoint_size.py)
    persist_s: float  # ... and persist
    save_bytes: int

    @property
    def total_s(self) -> float:
        return self.step_s + self.in_flight_s + self.staging_s + self.persist_s


def stop_time(spec: TrainingSpec) -> StopTime | None:
    """The stop's estimate, None where the layout has no step time (the layout rules say why)."""
    from lmspec.compiler.models.checkpoint_size import checkpoint_size
    from lmspec.compiler.models.params import computable
    from lmspec.compiler.models.steptime import estimate_step_time
    from lmspec.compiler.models.train_memory import estimate_train_memory

    memory = estimate_train_memory(spec) if computable(spec) else None
    step = estimate_step_time(spec, memory) if memory is not None else None
    if step is None:
        return None
    c = checkpoint_size(spec)
    in_flight = c.persist_s if c.async_save else 0.0
    return StopTime(float(step.total), in_flight, c.staging_s, c.persist_s, c.bytes_per_save)


def serve_instructions(plan: Plan) -> str:
    """REPORT.md's serving "run" row: what `lmspec run` applies and what the controllers start."""
    k, served = plan.spec.cluster.kubernetes, plan.served()
    name, replicas, nodes = object_name(plan.spec), served.spec.serve.replicas, served.layout.nodes
    if k.serve_flavor == RAY_SERVE:
        started = f"the RayService {name}: Ray Serve's vLLM app on {replicas} x {nodes} GPU pod(s)"
    else:
        started = (
            f"the LeaderWorkerSet {name}: {replicas} group(s) of {nodes} pod(s), their leaders behind the Service "
            f"{leader_service(name)}"
        )
    return f"`lmspec run build/{plan.name} --stage serve` (kubectl apply of {K8S_BUILD} and {K8S_SERVE}: {started})"


KUBERNETES = Launcher(
    name=NAME,
    section="cluster.kubernetes",
    rules=(
        image_required,
        setup_outside_the_image,
        object_names_fit,
        environment_names,
        serving_reachable,
        leaderworkerset_bounds,
        ray_serve_expressible,
        rack_nvlink_needs_imex,
    ),
    training_rules=(grace_covers_a_stop,),
    runtime="lmspec.runtime.launchers.kubernetes:KUBERNETES",
    serve_instructions=serve_instructions,
    serve_files=(),
    files="lmspec.compiler.emit.k8s:emit_kubernetes",
    carries=build_config_maps,
    report="lmspec.compiler.emit.k8s.report:kubernetes_section",
    container=False,
    # what pod.sh sends the trainer's process group on the kubelet's SIGTERM (torchrun.sh ignores it, as under Slurm)
    stop_signal=signal.SIGUSR1,
    doctor_module="lmspec.compiler.observe.doctor.kubernetes",
)
