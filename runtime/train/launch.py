"""The train stage of `lmspec run`: start the build's own launch scripts and follow them.

The launcher's runtime record (runtime/launchers/) starts them: cluster.launcher=local runs launch/torchrun.sh
in its own process group (Ctrl-C or SIGTERM stops the whole group); slurm submits launch/sbatch.sh with
`sbatch --wait` and prints a progress line until the job ends. Either way the exit code is the training's.
A launcher whose objects a cluster's controllers start (kubernetes: `submit_training`) checks and hands over
the job itself, and none of what follows runs here (the pods check their own data).
The scripts find the interpreter in $LMSPEC_PYTHON; lmspec sets it to its own interpreter when unset, except
for a build that runs in a container (cluster.slurm.container.image): there the image's python3 (or what
cluster.setup puts on PATH) runs the ranks, as this interpreter's path need not exist inside it.
The launcher is the typed spec's (spec.resolved.yaml through the schema), and every launch
file bash reads is checked against manifest.json before anything starts (compiler/build/reader.py);
then the training data (runtime/data/preflight.py): a dataset or tokenizer that is missing or
wrong exits 1 with every problem named, before torchrun or sbatch starts, as does a train.init_from
that is not a checkpoint step directory (runtime/train/init_from.py); so does a local launch of
train.transformer_impl=transformer_engine where the ranks' interpreter has no GPU or no TE
(runtime/train/te_preflight.py, which every rank runs again). The run then locks its directories and
refuses a checkpoint directory of a run of another identity (runtime/train/ownership.py).
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import sys
from pathlib import Path

from lmspec.compiler.build.files import LAUNCH_FILES
from lmspec.compiler.build.reader import Build
from lmspec.compiler.errors import EXIT_FAILED, EXIT_OK
from lmspec.compiler.launch_names import PYTHON_ENV, TRAIN_MODULE
from lmspec.runtime.data.preflight import data_ready
from lmspec.runtime.launchers import LauncherRuntime, runtime_of
from lmspec.runtime.process_group import EXIT_SIGINT, EXIT_SIGTERM
from lmspec.runtime.slurm import in_container
from lmspec.runtime.smoke_checks import Check, run_checks
from lmspec.runtime.train.init_from import init_from_ready
from lmspec.runtime.train.ownership import RunLock, refuse_another_run, stopped_line

logger = logging.getLogger(__name__)


def run_train(build: Build, options: argparse.Namespace) -> int:
    spec = build.training()
    launcher = runtime_of(spec.cluster)
    if launcher.submit_training is not None:  # the cluster's controllers start every rank: nothing runs here
        return launcher.submit_training(build, options)
    root = launch_root(build)
    env = launch_env(in_container(spec.cluster))
    command = launcher.command(root, ())
    if launcher.prints_node_commands(build, env):
        return EXIT_OK
    if options.dry_run:
        return print_dry_run(command, env, launcher)
    ready = data_ready(build.plan)  # before any worker starts or anything is written (--smoke too)
    if not (init_from_ready(spec) and ready and launcher.ranks_ready(root, spec, env)):
        return EXIT_FAILED
    if options.smoke:
        return smoke(root, launcher, env)
    refuse_another_run(spec)  # before anything is written, then one run at a time (ownership.py)
    given = env.get("NODE_RANK") or env.get("SLURM_NODEID") or "0"  # a local launch's is checked (env_preflight)
    node = int(given) if given.isdigit() else 0
    with RunLock(spec, Path(build.plan.paths.run_dir), node):
        code = launcher.run(command, env, spec.name)
    if code in (EXIT_SIGINT, EXIT_SIGTERM):
        print(stopped_line(spec, build.root, code))
    return code


def launch_env(container: bool = False) -> dict[str, str]:
    """This process's environment, with $LMSPEC_PYTHON defaulting to this interpreter, outside a container (in
    one, this machine's interpreter path means nothing: torchrun.sh's own default, the image's python3, runs)."""
    env = dict(os.environ)
    if not container:
        env.setdefault(PYTHON_ENV, sys.executable)
    return env


def print_dry_run(command: list[str], env: dict[str, str], launcher: LauncherRuntime) -> int:
    print(shell_line(command, env))
    for line in launcher.dry_run_lines:
        print(line)
    return EXIT_OK


def launch_root(build: Build) -> Path:
    """The build's absolute path, after checking every launch file bash will read against the
    manifest (sbatch.sh runs torchrun.sh, which sources nccl.env): an edited one is refused."""
    for rel in LAUNCH_FILES:
        build.script(rel)
    return build.root.resolve()


def shell_line(command: list[str], env: dict[str, str]) -> str:
    """The command as one pasteable shell line, with the interpreter it will use (when lmspec names one)."""
    if PYTHON_ENV not in env:
        return shlex.join(command)
    return f"{PYTHON_ENV}={shlex.quote(env[PYTHON_ENV])} {shlex.join(command)}"


def smoke(build: Path, launcher: LauncherRuntime, env: dict[str, str]) -> int:
    """Could this launch start? Scripts parse, the interpreter has torch and the trainer, and the launcher's
    own checks pass (Slurm: `sbatch --test-only` accepts the job). Runs nothing."""
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
        logger.info("smoke: the ranks' interpreter is the container image's: not checked here")
    return run_checks([*checks, *launcher.smoke_checks(build)], env)
