"""cluster.launcher=kubernetes at run time: the build's objects applied with kubectl, the API server's dry run first.

Training applies k8s/build.yaml (the ConfigMap carrying the build into every pod) with k8s/train.yaml (the
TrainJob and its ClusterTrainingRuntime, or the JobSet); serving applies it with k8s/serve.yaml (the
LeaderWorkerSet and its Service, or the RayService). Before anything is sent:
- every file the pods read is checked against manifest.json (compiler/build/reader.py), and k8s/build.yaml,
  which the manifest cannot list (the ConfigMap carries the manifest), must be byte for byte what the compiler
  makes of those verified files (the launcher's `carries`): an edited ConfigMap is refused, naming the command
  that compiles the build again;
- with a current kubectl context, `kubectl apply --server-side --dry-run=server` must pass: the API server and
  its admission webhooks (Trainer's, JobSet's, LeaderWorkerSet's, Kueue's) judge every object, and a refusal
  applies nothing (exit 1, kubectl's message shown). Then the same without `--dry-run`, and the commands that
  follow the job (get, logs, delete). lmspec does not wait for the job: its controllers run it.
Without kubectl or without a current context, lmspec prints those commands (a script: every other line is a
`#` comment) and exits 0; `--dry-run` prints them and runs nothing, kubectl included.

The pods check their training data, interpreter and Transformer Engine themselves (the trainer's preflights,
runtime/train/loop.py) on their own volume, which need not be this machine's: nothing here asks this machine's
data or Python. `--stage import` runs torchrun on this machine and no object of the build runs it: it is
refused with the way to import where the pods' volume is.
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from lmspec.compiler.build.files import K8S_BUILD, K8S_SERVE, K8S_TRAIN, MANIFEST
from lmspec.compiler.build.reader import MAX_FILE_BYTES, Build
from lmspec.compiler.build.safe_read import Unreadable, read_regular_below
from lmspec.compiler.errors import EXIT_FAILED, EXIT_OK, UsageError
from lmspec.compiler.launchers.k8s.build_config import NOT_CARRIED
from lmspec.compiler.launchers.kubernetes import KUBERNETES as COMPILED
from lmspec.compiler.models.serve_layout import ServeLayout
from lmspec.compiler.spec.sections import TrainingSpec
from lmspec.runtime.launchers import Env, LauncherRuntime
from lmspec.runtime.smoke_checks import Check, run_checks

logger = logging.getLogger(__name__)

KUBECTL = "kubectl"
FIELD_MANAGER = "lmspec"  # server-side apply records lmspec as the owner of every field it sets
# the labels the controllers put on the pods they create (JobSet: on every pod of its Jobs, which Trainer's
# TrainJob runs as a JobSet of its own name; the Job controller: each Indexed Job pod's index)
JOBSET_LABEL = "jobset.sigs.k8s.io/jobset-name"
POD_INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
LWS_LABEL = "leaderworkerset.sigs.k8s.io/name"
RAY_SERVE_SERVICE = "serve-svc"  # KubeRay names the Service of a RayService's Serve app <name>-serve-svc


@dataclass(frozen=True)
class Applied:
    """What one stage applies: the build's files, in order (the ConfigMap first: the pods mount it), and the
    objects of its job file."""

    root: Path  # the build's absolute path
    files: tuple[str, ...]  # relative to the build
    objects: tuple[dict[str, Any], ...]  # the job file's documents, as compiled
    namespace: str
    queue: str | None  # Kueue's LocalQueue: the job waits, suspended, until Kueue admits it
    claim: str | None  # the volume claim of the pods' work_dir (runs/, checkpoints); None: an emptyDir

    def apply(self, *, dry_run: bool) -> list[str]:
        """`kubectl apply --server-side` of every file, in the spec's namespace; with `dry_run`, the API server
        checks them (schemas, CEL rules, admission webhooks) and stores nothing."""
        files = [arg for rel in self.files for arg in ("-f", str(self.root / rel))]
        dry = ["--dry-run=server"] if dry_run else []
        return [
            KUBECTL,
            "apply",
            "--server-side",
            f"--field-manager={FIELD_MANAGER}",
            f"--namespace={self.namespace}",
            *dry,
            *files,
        ]


def verified(build: Build, job_file: str) -> Applied:
    """The files a stage applies, each checked: every carried build file against manifest.json, k8s/build.yaml
    against what they make, the job file against manifest.json. DamagedBuild (exit 2) otherwise."""
    check_carried(build)
    text = build.text(job_file)
    objects = tuple(doc for doc in yaml.safe_load_all(text) if doc)
    k8s = build.spec.cluster.kubernetes
    return Applied(build.root.resolve(), (K8S_BUILD, job_file), objects, k8s.namespace, k8s.queue, k8s.volume_claim)


def check_carried(build: Build) -> None:
    """k8s/build.yaml, which manifest.json cannot list, is what the compiler makes of the files it does list
    (each carried one read through the manifest check, so each is as compiled), byte for byte."""
    files = {rel: build.text(rel) for rel in build.manifest.files if rel not in NOT_CARRIED}  # REPORT.md is people's
    files[MANIFEST] = build.manifest.text
    carries = COMPILED.carries
    for rel, text in (carries(build.plan, files) if carries is not None else {}).items():
        try:
            found = read_regular_below(build.root, rel, MAX_FILE_BYTES)
        except Unreadable as exc:
            raise build.refuse(rel, str(exc)) from None
        if found != text.encode("utf-8"):
            raise build.refuse(
                rel,
                f"changed since lmspec compiled it (it is not the ConfigMap lmspec makes of the files {MANIFEST} "
                "lists, which every pod reads)",
            )


def current_context(env: Env) -> tuple[str | None, str]:
    """kubectl's current context, or None and why there is none (no kubectl on PATH, no context set)."""
    try:
        result = subprocess.run(
            [KUBECTL, "config", "current-context"], env=env, capture_output=True, text=True, check=False
        )
    except FileNotFoundError:
        return None, f"{KUBECTL} is not on PATH"
    except OSError as exc:
        return None, f"{KUBECTL} could not be started ({exc.strerror})"
    context = result.stdout.strip()
    if result.returncode != 0 or not context:
        said = (result.stderr.strip() or result.stdout.strip()).splitlines()
        return None, f"`{KUBECTL} config current-context` names none" + (f" ({said[-1]})" if said else "")
    return context, ""


def follow_lines(applied: Applied) -> list[str]:
    """The commands that follow the applied job, what `lmspec doctor` reads of it, and the one that deletes it."""
    ns = f"--namespace={applied.namespace}"
    doctor = f"   # events and exit codes: `lmspec doctor pods.txt --build {shlex.quote(str(applied.root))}`"
    lines = []
    if applied.queue is not None:
        lines.append(
            shlex.join([KUBECTL, "get", "workloads", ns])
            + f"   # Kueue's LocalQueue {applied.queue} admits the job; it waits suspended until then"
        )
    for obj in applied.objects:
        kind, name = str(obj.get("kind")), obj["metadata"]["name"]
        if kind in ("TrainJob", "JobSet"):  # Trainer runs a TrainJob as a JobSet of its own name
            pods = f"{JOBSET_LABEL}={name}"
            lines += [
                shlex.join([KUBECTL, "get", kind.lower(), name, ns]),
                shlex.join([KUBECTL, "get", "pods", ns, "-l", pods, "-o", "wide"]),
                shlex.join([KUBECTL, "logs", ns, "-f", "-l", f"{pods},{POD_INDEX_LABEL}=0"]) + "   # node 0",
                shlex.join([KUBECTL, "describe", "pods", ns, "-l", pods]) + " > pods.txt" + doctor,
            ]
        elif kind == "LeaderWorkerSet":  # group 0's leader pod is <name>-0, its workers <name>-0-<index>
            pods = f"{LWS_LABEL}={name}"
            lines += [
                shlex.join([KUBECTL, "get", kind.lower(), name, ns]),
                shlex.join([KUBECTL, "get", "pods", ns, "-l", pods, "-o", "wide"]),
                shlex.join([KUBECTL, "logs", ns, "-f", f"{name}-0"]) + "   # the leader of group 0",
                shlex.join([KUBECTL, "describe", "pods", ns, "-l", pods]) + " > pods.txt" + doctor,
            ]
        elif kind == "RayService":  # KubeRay's Service in front of Ray Serve: <name>-serve-svc, the head's serve port
            head = obj["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"][0]
            port = str(head["ports"][0]["containerPort"])
            lines += [
                shlex.join([KUBECTL, "get", kind.lower(), name, ns]),
                shlex.join([KUBECTL, "describe", kind.lower(), name, ns]),
                shlex.join([KUBECTL, "port-forward", ns, f"service/{name}-{RAY_SERVE_SERVICE}", f"{port}:{port}"])
                + f"   # then http://127.0.0.1:{port}/v1, once the RayService is Ready",
            ]
        elif kind == "Service":
            port = str(obj["spec"]["ports"][0]["port"])
            lines.append(
                shlex.join([KUBECTL, "port-forward", ns, f"service/{name}", f"{port}:{port}"])
                + f"   # then http://127.0.0.1:{port}/v1; /health answers once vLLM is up"
            )
    job, configmaps = applied.files[-1], applied.files[0]
    lines.append(
        shlex.join([KUBECTL, "delete", ns, "-f", str(applied.root / job)])
        + (
            f"   # stops and removes the job; the volume claim {applied.claim} and what is on it stay"
            if applied.claim
            else "   # stops and removes the job, and its runs/ (an emptyDir: cluster.kubernetes.volume_claim keeps it)"
        )
    )
    lines.append(
        shlex.join([KUBECTL, "delete", ns, "-f", str(applied.root / configmaps)])
        + "   # the build ConfigMaps, once no job of this build runs"
    )
    return lines


def print_commands(applied: Applied, why: str) -> int:
    """The commands to run by hand, as a script (the rest are # comments); nothing is run."""
    print(f"# {why}: lmspec applies nothing. With kubectl pointed at the cluster, check the objects, then apply them:")
    print(shlex.join(applied.apply(dry_run=True)))
    print(shlex.join(applied.apply(dry_run=False)))
    print("# then follow the job:")
    for line in follow_lines(applied):
        print(line)
    return EXIT_OK


def kubectl(command: list[str], env: Env) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, env=env, capture_output=True, text=True, check=False)


def apply(applied: Applied, env: Env, context: str) -> int:
    """The server-side dry run, then, only when it passed, the apply; then how to follow. Exit 1 with kubectl's
    message when the API server refuses either."""
    what = ", ".join(f"{o.get('kind')}/{o['metadata']['name']}" for o in applied.objects)
    logger.info(f"lmspec run: {what} in namespace {applied.namespace} (kubectl context {context})")
    dry = kubectl(applied.apply(dry_run=True), env)
    if dry.returncode != 0:
        _kubectl_said(dry)
        logger.error(
            f"lmspec run: the API server refused the objects in its dry run "
            f"(`{shlex.join(applied.apply(dry_run=True))}` exited {dry.returncode}); nothing was applied"
        )
        return EXIT_FAILED
    done = kubectl(applied.apply(dry_run=False), env)
    if done.returncode != 0:
        _kubectl_said(done)
        logger.error(
            f"lmspec run: `{shlex.join(applied.apply(dry_run=False))}` exited {done.returncode} after its dry run "
            "passed; what it applied is listed above"
        )
        return EXIT_FAILED
    print(done.stdout, end="" if done.stdout.endswith("\n") or not done.stdout else "\n")
    print("# follow the job:")
    for line in follow_lines(applied):
        print(line)
    return EXIT_OK


def _kubectl_said(result: subprocess.CompletedProcess[str]) -> None:
    if result.stdout:
        print(result.stdout, end="" if result.stdout.endswith("\n") else "\n")
    if result.stderr:
        print(result.stderr, end="" if result.stderr.endswith("\n") else "\n", file=sys.stderr)


def submit(build: Build, job_file: str, env: Env, options: argparse.Namespace) -> int:
    """What `lmspec run` does with a stage's objects: checked, then printed (`--dry-run`, or no context),
    smoke-checked (`--smoke`: the pods' scripts parse, and the API server's dry run passes), or applied."""
    applied = verified(build, job_file)
    if options.dry_run:
        return print_commands(applied, "--dry-run")
    context, why = current_context(env)
    if options.smoke:
        # every script the ConfigMap carries into the pods (pod.sh, and what it runs)
        scripts = sorted(rel for rel in build.manifest.files if rel.endswith(".sh") and rel not in NOT_CARRIED)
        checks: list[Check] = [(f"{rel} parses (bash -n)", ["bash", "-n", str(applied.root / rel)]) for rel in scripts]
        if context is not None:
            checks.append((f"the API server accepts the objects (context {context})", applied.apply(dry_run=True)))
        else:
            logger.info(f"smoke: the API server's dry run is skipped: {why}")
        return run_checks(checks, env)
    if context is None:
        return print_commands(applied, why)
    return apply(applied, env, context)


def submit_training(build: Build, options: argparse.Namespace) -> int:
    """k8s/train.yaml applied with the ConfigMap: the controllers start every node; lmspec does not wait."""
    return submit(build, K8S_TRAIN, dict(os.environ), options)


def command(build: Path, entry: tuple[str, ...]) -> list[str]:
    """No command of this machine's runs a Kubernetes build's ranks: training is `submit_training`'s, and
    `--stage import` (torchrun of launch/torchrun.sh's import entry, here) has no object in the build."""
    raise UsageError(
        f"--stage {entry[0] if entry else 'train'} starts torchrun on this machine, and a cluster.launcher=kubernetes "
        "build's ranks run only in the pods of k8s/train.yaml (no object of the build imports). Import where GPUs "
        "read the "
        "HuggingFace directory: compile the same model with cluster=local and a layout that fits that machine (a "
        "checkpoint reshards when loaded), run `lmspec run <that build> --stage import --from HF_DIR` there (on a "
        "node, or in a pod of cluster.kubernetes.image that mounts cluster.kubernetes.volume_claim at "
        "cluster.kubernetes.work_dir, from that directory), then compile this spec with "
        "train.init_from=<work_dir>/runs/<name>/imported/step_0 and run it"
    )


def run(command: list[str], env: Env, name: str) -> int:
    raise UsageError("a cluster.launcher=kubernetes build is started by applying its objects (lmspec run BUILD)")


def pods_start_themselves(build: Build, env: Env) -> bool:
    return False


def pods_check_themselves(build: Path, spec: TrainingSpec, env: Env) -> bool:
    """Nothing to ask here: the trainer checks its data and Transformer Engine in every pod."""
    return True


def smoke_checks(build: Path) -> list[Check]:
    return []


def engine_files(layout: ServeLayout) -> tuple[str, ...]:
    """The objects the serve stage applies; the scripts the pods run are checked with the ConfigMap that
    carries them (check_carried)."""
    return (K8S_SERVE,)


def start_serving(build: Build, env: Env, env_prefix: str, options: argparse.Namespace) -> int:
    """k8s/serve.yaml applied with the ConfigMap: the engine runs in the pods until its objects are deleted."""
    return submit(build, K8S_SERVE, env, options)


KUBERNETES = LauncherRuntime(
    command=command,
    dry_run_lines=(),
    run=run,
    prints_node_commands=pods_start_themselves,
    ranks_ready=pods_check_themselves,
    smoke_checks=smoke_checks,
    engine_files=engine_files,
    start_serving=start_serving,
    submit_training=submit_training,
)
