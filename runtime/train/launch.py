"""The train stage of `lmspec run`: start the build's own launch scripts and follow them.

cluster.launcher=local runs launch/torchrun.sh in its own process group (Ctrl-C or SIGTERM
stops the whole group); slurm submits launch/sbatch.sh with `sbatch --wait` and prints a
progress line until the job ends. Either way the exit code is the training's. The scripts
find the interpreter in $LMSPEC_PYTHON; lmspec sets it to its own interpreter when unset, except for a
build that runs in a container (cluster.slurm.container.image): there the image's python3 (or what
cluster.setup puts on PATH) runs the ranks, as this interpreter's path need not exist inside it.
The launcher is the typed spec's (spec.resolved.yaml through the schema), and every launch
file bash reads is checked against manifest.json before anything starts (compiler/build/reader.py);
then the training data (runtime/data/preflight.py): a dataset or tokenizer that is missing or
wrong exits 1 with every problem named, before torchrun or sbatch starts, as does a train.init_from
that is not a checkpoint step directory (runtime/train/init_from.py); so does a local launch of
train.transformer_impl=transformer_engine where the ranks' interpreter has no GPU or no TE
(runtime/train/te_preflight.py, which every rank runs again).
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from lmspec.compiler.build.files import LAUNCH_FILES, SBATCH_SH, TORCHRUN_SH
from lmspec.compiler.build.reader import Build
from lmspec.compiler.errors import EXIT_FAILED, EXIT_OK
from lmspec.compiler.launch_names import PYTHON_ENV, TRAIN_MODULE
from lmspec.compiler.launchers import launcher_of
from lmspec.compiler.launchers.launcher import Launcher
from lmspec.runtime.data.preflight import data_ready
from lmspec.runtime.process_group import EXIT_SIGINT, EXIT_SIGTERM, Terminated, sigterm_raises, stop_group
from lmspec.runtime.slurm import in_container, sbatch_command, sbatch_test_command, submit
from lmspec.runtime.smoke_checks import Check, run_checks
from lmspec.runtime.train.init_from import init_from_ready
from lmspec.runtime.train.te_preflight import TE_PREFLIGHT_MODULE

logger = logging.getLogger(__name__)

POLL_INTERVAL_S = 2.0  # squeue polling while a Slurm job runs
NODE0_ADDRESS, NODE0_PORT = "ADDRESS", "PORT"  # placeholders in the per-node commands of a multi-node local job


def run_train(build: Build, options: argparse.Namespace) -> int:
    spec = build.training()
    launcher = launcher_of(spec.cluster)
    root = launch_root(build)
    env = launch_env(in_container(spec.cluster))
    command = launch_command(root, launcher)
    if not launcher.batch_job and build.plan.trained().layout.nodes > 1 and not this_node_given(env):
        return print_node_commands(build, env)
    if options.dry_run:
        return print_dry_run(command, env, launcher)
    ready = data_ready(build.plan)  # before any worker starts or anything is written (--smoke too)
    if not (init_from_ready(spec) and ready):
        return EXIT_FAILED
    if not launcher.batch_job and spec.train.transformer_impl == "transformer_engine":
        # TE and a GPU, asked of the interpreter the ranks will run (it may not be this one)
        if subprocess.run([env[PYTHON_ENV], "-m", TE_PREFLIGHT_MODULE, str(root)], env=env, check=False).returncode:
            return EXIT_FAILED
    if options.smoke:
        return smoke(root, launcher, env)
    return launch(command, env, launcher, spec.name)


def this_node_given(env: dict[str, str]) -> bool:
    """Whether the environment names one node of several for torchrun.sh: its rank and node 0's address."""
    return bool(env.get("MASTER_ADDR")) and bool(env.get("NODE_RANK") or env.get("SLURM_NODEID"))


def print_node_commands(build: Build, env: dict[str, str]) -> int:
    """What to run on each node of a multi-node job on cluster.launcher=local; starts nothing:
    one node started alone would wait at the rendezvous for the others until it timed out."""
    spec, layout, root = build.training(), build.plan.trained().layout, build.root.resolve()
    port = spec.cluster.master_port
    script = Path(sys.executable).parent / "lmspec"
    lmspec = str(script) if script.is_file() else "lmspec"
    print(
        f"{build.root} trains on {layout.nodes} nodes x {layout.gpus_per_node} rank(s) (cluster.launcher=local): "
        "lmspec starts no node for it here. On each node, from the same working directory on a file system they "
        f"share (runs/ is written there, and the build is read at {root}), with {NODE0_ADDRESS} node 0's address "
        "as the other nodes reach it" + ("" if port else f" and {NODE0_PORT} a free port on node 0") + ":"
    )
    for node in range(layout.nodes):
        variables = {PYTHON_ENV: env[PYTHON_ENV], "NODE_RANK": str(node)}
        assigned = " ".join(f"{k}={shlex.quote(v)}" for k, v in variables.items())
        print(
            f"  node {node}: {assigned} MASTER_ADDR={NODE0_ADDRESS} MASTER_PORT={port or NODE0_PORT} "
            f"{shlex.join([lmspec, 'run', str(root)])}"
        )
    print(
        "each checks its training data, then starts launch/torchrun.sh for its node (the same variables run that "
        "script by hand); cluster=slurm starts every node as one job: compile with cluster=slurm, then run this again"
    )
    return EXIT_OK


def launch_env(container: bool = False) -> dict[str, str]:
    """This process's environment, with $LMSPEC_PYTHON defaulting to this interpreter, outside a container (in
    one, this machine's interpreter path means nothing: torchrun.sh's own default, the image's python3, runs)."""
    env = dict(os.environ)
    if not container:
        env.setdefault(PYTHON_ENV, sys.executable)
    return env


def print_dry_run(command: list[str], env: dict[str, str], launcher: Launcher) -> int:
    print(shell_line(command, env))
    if launcher.batch_job:
        print(
            f"squeue --noheader --jobs <job id> --format '%T %M %R'   # every {POLL_INTERVAL_S:g} s until the job ends"
        )
    return EXIT_OK


def launch(command: list[str], env: dict[str, str], launcher: Launcher, name: str) -> int:
    """Run `command` (launch_command's) to its end: a local process group, or a Slurm job followed."""
    if not launcher.batch_job:
        return _run_local(command, env)
    return _run_slurm(command, env, name)


def launch_root(build: Build) -> Path:
    """The build's absolute path, after checking every launch file bash will read against the
    manifest (sbatch.sh runs torchrun.sh, which sources nccl.env): an edited one is refused."""
    for rel in LAUNCH_FILES:
        build.script(rel)
    return build.root.resolve()


def launch_command(build: Path, launcher: Launcher, entry: tuple[str, ...] = ()) -> list[str]:
    """The build's own launcher; `entry` (torchrun.sh's ENTRY ARGS...) picks what every rank runs, default train."""
    if not launcher.batch_job:
        return ["bash", str(build / TORCHRUN_SH), str(build), *entry]
    return sbatch_command(build / SBATCH_SH, (str(build), *entry), wait=True)


def shell_line(command: list[str], env: dict[str, str]) -> str:
    """The command as one pasteable shell line, with the interpreter it will use (when lmspec names one)."""
    if PYTHON_ENV not in env:
        return shlex.join(command)
    return f"{PYTHON_ENV}={shlex.quote(env[PYTHON_ENV])} {shlex.join(command)}"


def _run_local(command: list[str], env: dict[str, str]) -> int:
    proc = subprocess.Popen(command, env=env, start_new_session=True)
    try:
        with sigterm_raises():
            return proc.wait()
    except KeyboardInterrupt:
        logger.warning("lmspec run: interrupted; stopping the training processes")
        stop_group(proc)
        return EXIT_SIGINT
    except Terminated:
        stop_group(proc)
        return EXIT_SIGTERM


def _job_state(job_id: str, env: dict[str, str]) -> str:
    result = subprocess.run(
        ["squeue", "--noheader", "--jobs", job_id, "--format", "%T %M %R"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    return result.stdout.strip() if result.returncode == 0 else ""


def _run_slurm(command: list[str], env: dict[str, str], name: str) -> int:
    proc, job_id = submit(command, env)
    if not job_id:
        return proc.wait() or 1  # sbatch refused the script; it printed why
    logger.info(f"submitted Slurm job {job_id}; log: {Path.cwd() / f'slurm-{name}-{job_id}.out'}")
    try:
        with sigterm_raises():
            rc = _follow(proc, job_id, env)
    except (KeyboardInterrupt, Terminated) as exc:
        logger.warning(f"\nlmspec run: cancelling Slurm job {job_id}")
        subprocess.run(["scancel", job_id], env=env, check=False)
        proc.wait()
        return EXIT_SIGINT if isinstance(exc, KeyboardInterrupt) else EXIT_SIGTERM
    logger.info(f"Slurm job {job_id} ended with exit code {rc}")
    return rc


def _follow(proc: subprocess.Popen[str], job_id: str, env: dict[str, str]) -> int:
    """One progress line (rewritten in place on a terminal) until `sbatch --wait` returns."""
    tty, shown, started = sys.stdout.isatty(), "", time.monotonic()
    while proc.poll() is None:
        state = _job_state(job_id, env)
        line = f"job {job_id}: {state or 'finishing'} (followed for {time.monotonic() - started:.0f} s)"
        if tty:
            print(f"\r{line}\033[K", end="", flush=True)
        elif state.split(" ")[:1] != shown.split(" ")[:1]:
            print(line, flush=True)
        shown = state
        try:
            proc.wait(timeout=POLL_INTERVAL_S)
        except subprocess.TimeoutExpired:
            pass
    if tty:
        print()
    return proc.returncode


def smoke(build: Path, launcher: Launcher, env: dict[str, str]) -> int:
    """Could this launch start? Scripts parse, the interpreter has torch and the trainer, and
    on Slurm `sbatch --test-only` accepts the job. Runs nothing."""
    checks: list[Check] = [(f"{rel} parses (bash -n)", ["bash", "-n", str(build / rel)]) for rel in LAUNCH_FILES]
    if PYTHON_ENV in env:  # not a container's interpreter, which only the image has
        checks.append(
            (
                f"{env[PYTHON_ENV]} imports torch.distributed.run and finds {TRAIN_MODULE}",
                [
                    env[PYTHON_ENV],
                    "-c",
                    "import importlib.util, sys, torch.distributed.run; "
                    f"sys.exit(0 if importlib.util.find_spec({TRAIN_MODULE!r}) else '{TRAIN_MODULE} not found')",
                ],
            )
        )
    else:
        print("smoke: the ranks' interpreter is the container image's: not checked here")
    if launcher.batch_job:
        checks.append(
            (
                "Slurm accepts the job (sbatch --test-only)",
                sbatch_test_command(build / SBATCH_SH, (str(build),)),
            )
        )
    return run_checks(checks, env)
