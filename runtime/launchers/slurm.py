"""cluster.launcher=slurm at run time: the build's batch script submitted, and for training followed to its end.

Training submits launch/sbatch.sh with `sbatch --wait` and prints a progress line until the job ends; its
exit code is the training's, and Ctrl-C or SIGTERM cancels the job. Serving submits serve/sbatch.sh, whose
engine (one node or many) runs until the job is cancelled, and prints the job id and the way to its
endpoint. The sbatch command line is runtime/slurm.py's. Every rank checks its own node (the data and
Transformer Engine preflights), so nothing is asked of this machine's interpreter beyond the smoke checks.
"""

from __future__ import annotations

import argparse
import logging
import shlex
import subprocess
import sys
import time
from pathlib import Path

from lmspec.compiler.build.files import NCCL_ENV, SBATCH_SH, SERVE_SBATCH_SH, VLLM_YAML, serve_scripts
from lmspec.compiler.build.reader import Build
from lmspec.compiler.endpoint import endpoint
from lmspec.compiler.errors import EXIT_OK
from lmspec.compiler.launchers.slurm import SLURM as COMPILED
from lmspec.compiler.models.serve_layout import ServeLayout
from lmspec.compiler.spec.sections import TrainingSpec
from lmspec.runtime.launchers import Env, LauncherRuntime
from lmspec.runtime.process_group import EXIT_SIGINT, EXIT_SIGTERM, Terminated, sigterm_raises
from lmspec.runtime.serve.stage import node_flags
from lmspec.runtime.slurm import sbatch_command, sbatch_test_command, submit
from lmspec.runtime.smoke_checks import Check, run_checks

logger = logging.getLogger(__name__)

POLL_INTERVAL_S = 2.0  # squeue polling while a Slurm job runs
SQUEUE_FORMAT = "%T %M %R"  # state, time used, reason or nodes
FOLLOWED = (
    f"squeue --noheader --jobs <job id> --format '{SQUEUE_FORMAT}'   # every {POLL_INTERVAL_S:g} s until the job ends"
)


def command(build: Path, entry: tuple[str, ...]) -> list[str]:
    return sbatch_command(build / SBATCH_SH, (str(build), *entry), wait=True)


def run(command: list[str], env: Env, name: str) -> int:
    """Submit `command` and follow the job until it ends; Ctrl-C or SIGTERM cancels it."""
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


def _job_state(job_id: str, env: Env) -> str:
    result = subprocess.run(
        ["squeue", "--noheader", "--jobs", job_id, "--format", SQUEUE_FORMAT],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    return result.stdout.strip() if result.returncode == 0 else ""


def _follow(proc: subprocess.Popen[str], job_id: str, env: Env) -> int:
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


def starts_every_node(build: Build, env: Env) -> bool:
    """Never prints per-node commands: the job starts every node."""
    return False


def ranks_check_themselves(build: Path, spec: TrainingSpec, env: Env) -> bool:
    """Nothing to ask here: every rank runs the Transformer Engine preflight on its own node."""
    return True


def smoke_checks(build: Path) -> list[Check]:
    return [("Slurm accepts the job (sbatch --test-only)", sbatch_test_command(build / SBATCH_SH, (str(build),)))]


def engine_files(layout: ServeLayout) -> tuple[str, ...]:
    """serve/sbatch.sh (the files only this launcher emits), then the scripts it runs on each node, which
    source the build's network settings."""
    return (*COMPILED.serve_files, *serve_scripts(layout.nodes), NCCL_ENV, VLLM_YAML)


def start_serving(build: Build, env: Env, env_prefix: str, options: argparse.Namespace) -> int:
    """serve/sbatch.sh submitted: the engine runs until its job is cancelled; the vLLM flags node_flags adds go
    to every node's script. `--smoke`: the scripts parse and Slurm would accept the job (sbatch --test-only);
    nothing is submitted."""
    spec, root = build.serving(), build.root.resolve()
    args = (str(root), *node_flags(build.plan, dry_run=options.dry_run))
    command = sbatch_command(root / SERVE_SBATCH_SH, args, wait=False)
    if options.dry_run:
        print(env_prefix + shlex.join(command))
        return EXIT_OK
    if options.smoke:
        files = engine_files(build.plan.served().layout)
        checks: list[Check] = [
            (f"{r} parses (bash -n)", ["bash", "-n", str(root / r)]) for r in files if r.endswith(".sh")
        ]
        checks.append(("Slurm accepts the job (sbatch --test-only)", sbatch_test_command(root / SERVE_SBATCH_SH, args)))
        return run_checks(checks, env)
    proc, job_id = submit(command, env)
    if not job_id:
        return proc.wait() or 1  # sbatch refused the script; it printed why
    proc.wait()
    host = "NODE0"
    logger.info(
        f"submitted Slurm job {job_id}: vLLM on {build.plan.served().layout.nodes} node(s), logging to "
        f"serve-{spec.name}-{job_id}-node<N>.log here; clients: {endpoint(host, spec.serve.port)} with {host} the "
        f"job's first node (`squeue --noheader --jobs {job_id} --format %N` lists them) once "
        f"{endpoint(host, spec.serve.port, '/health')} answers; `scancel {job_id}` stops it"
    )
    return EXIT_OK


SLURM = LauncherRuntime(
    command=command,
    dry_run_lines=(FOLLOWED,),
    run=run,
    prints_node_commands=starts_every_node,
    ranks_ready=ranks_check_themselves,
    smoke_checks=smoke_checks,
    engine_files=engine_files,
    start_serving=start_serving,
)
