"""cluster.launcher=local at run time: `lmspec run` starts this machine's processes itself, prints the others'.

Training runs launch/torchrun.sh in its own process group, killed with `lmspec run` (Ctrl-C or SIGTERM: the
trainers checkpoint and stop, lmspec.runtime.process_group), after asking the interpreter the ranks will use
whether it runs the build's Transformer Engine layers (runtime/train/te_preflight.py). A one-node engine
is served here (runtime/serve/stage.py). A job on several nodes is started by hand on each: lmspec prints
each node's command and starts nothing, as one node started alone would wait at the rendezvous for the
others (training) or serve another layout than the one compiled and budgeted (serving); a training node
given its NODE_RANK and MASTER_ADDR starts its own ranks.
"""

from __future__ import annotations

import argparse
import logging
import shlex
import signal
import subprocess
import sys
from pathlib import Path

from lmspec.compiler.build.files import NCCL_ENV, SERVE_HEAD_SH, SERVE_WORKER_SH, TORCHRUN_SH, VLLM_YAML, serve_scripts
from lmspec.compiler.build.reader import Build
from lmspec.compiler.endpoint import endpoint
from lmspec.compiler.errors import EXIT_OK
from lmspec.compiler.launch_names import PYTHON_ENV
from lmspec.compiler.models.serve_layout import ServeLayout
from lmspec.compiler.spec.sections import TrainingSpec
from lmspec.runtime.env_preflight import check_launch
from lmspec.runtime.launchers import Env, LauncherRuntime
from lmspec.runtime.process_group import (
    EXIT_SIGINT,
    EXIT_SIGTERM,
    Terminated,
    dies_with_this_process,
    sigterm_raises,
    stop_trainers,
)
from lmspec.runtime.rank_failures import report_failed_ranks
from lmspec.runtime.serve.stage import node_flags, serve_here
from lmspec.runtime.smoke_checks import Check
from lmspec.runtime.train.te_preflight import TE_PREFLIGHT_MODULE

logger = logging.getLogger(__name__)

ADDRESS = "ADDRESS"  # placeholder for node 0's address as the other nodes reach it
NODE0_PORT = "PORT"  # placeholder for a free port on node 0, when cluster.master_port names none


def command(build: Path, entry: tuple[str, ...]) -> list[str]:
    return ["bash", str(build / TORCHRUN_SH), str(build), *entry]


def run(command: list[str], env: Env, name: str) -> int:
    """torchrun.sh (which execs torchrun) in a session of its own, SIGKILLed by the kernel if this process dies;
    Ctrl-C or SIGTERM ask its trainers to checkpoint and stop (lmspec.runtime.process_group.stop_trainers)."""
    proc = subprocess.Popen(command, env=env, start_new_session=True, preexec_fn=dies_with_this_process(signal.SIGKILL))
    try:
        with sigterm_raises():
            return report_failed_ranks(proc.wait(), proc.pid, name)  # a failure ends in its one-line summary
    except KeyboardInterrupt:
        code = EXIT_SIGINT
    except Terminated:
        code = EXIT_SIGTERM
    logger.warning(f"lmspec run: {signal.Signals(code - 128).name}: the trainers checkpoint and stop")
    stop_trainers(proc)
    return code


def this_node_given(env: Env) -> bool:
    """Whether the environment names one node of several for torchrun.sh: its rank and node 0's address."""
    return bool(env.get("MASTER_ADDR")) and bool(env.get("NODE_RANK") or env.get("SLURM_NODEID"))


def print_node_commands(build: Build, env: Env) -> bool:
    """What to run on each node of a multi-node training job, unless this is one of them (this_node_given)."""
    spec, layout, root = build.training(), build.plan.trained().layout, build.root.resolve()
    if layout.nodes == 1 or this_node_given(env):
        return False
    port = spec.cluster.master_port
    script = Path(sys.executable).parent / "lmspec"
    lmspec = str(script) if script.is_file() else "lmspec"
    print(
        f"{build.root} trains on {layout.nodes} nodes x {layout.gpus_per_node} rank(s) (cluster.launcher=local): "
        "lmspec starts no node for it here. On each node, from the same working directory on a file system they "
        f"share (runs/ is written there, and the build is read at {root}), with {ADDRESS} node 0's address "
        "as the other nodes reach it" + ("" if port else f" and {NODE0_PORT} a free port on node 0") + ":"
    )
    for node in range(layout.nodes):
        variables = {PYTHON_ENV: env[PYTHON_ENV], "NODE_RANK": str(node)}
        assigned = " ".join(f"{k}={shlex.quote(v)}" for k, v in variables.items())
        print(
            f"  node {node}: {assigned} MASTER_ADDR={ADDRESS} MASTER_PORT={port or NODE0_PORT} "
            f"{shlex.join([lmspec, 'run', str(root)])}"
        )
    print(
        "each checks its training data, then starts launch/torchrun.sh for its node (the same variables run that "
        "script by hand); cluster=slurm starts every node as one job: compile with cluster=slurm, then run this again"
    )
    return True


def ranks_ready(build: Path, spec: TrainingSpec, env: Env) -> bool:
    """Transformer Engine and a GPU, asked of the interpreter the ranks will run (it may not be this one)."""
    check_launch(env, spec)  # first: a wrong variable or an unwritable run directory is one line, not a hang
    if spec.train.transformer_impl != "transformer_engine":
        return True
    return (
        subprocess.run([env[PYTHON_ENV], "-m", TE_PREFLIGHT_MODULE, str(build)], env=env, check=False).returncode == 0
    )


def smoke_checks(build: Path) -> list[Check]:
    """None beyond the scripts and the interpreter: torchrun needs no one's permission."""
    return []


def engine_files(layout: ServeLayout) -> tuple[str, ...]:
    """A one-node engine's serve.sh, or head.sh + worker.sh, which source the build's network settings."""
    return (*serve_scripts(layout.nodes), *((NCCL_ENV,) if layout.nodes > 1 else ()), VLLM_YAML)


def start_serving(build: Build, env: Env, env_prefix: str, options: argparse.Namespace) -> int:
    if build.plan.served().layout.nodes == 1:
        return serve_here(build, env, env_prefix, options)
    return print_engine_commands(build, env_prefix, node_flags(build.plan, dry_run=options.dry_run))


def print_engine_commands(build: Build, env_prefix: str, extra: list[str]) -> int:
    """What to run on each node of a multi-node engine; starts nothing."""
    spec, layout = build.serving(), build.plan.served().layout
    root = build.root.resolve()
    per_node = ", ".join(f"{role.name}: {role.gpus_per_node} GPU(s)" for role in layout.roles)
    print(
        f"{build.root} serves on {layout.nodes} nodes ({layout.mode}, {layout.gpus} GPUs; {per_node}): lmspec starts "
        "no engine for it here. On each node, from the directory that holds runs/ (the build and "
        f"{spec.serve.model_path or build.plan.served().model_dir} reachable at the same paths), with {ADDRESS} "
        "node 0's address as the other nodes reach it:"
    )
    for role in layout.roles:
        script = root / (SERVE_HEAD_SH if role.name == "head" else SERVE_WORKER_SH)
        for node in role.nodes:
            args = [ADDRESS] if role.name == "head" else [ADDRESS, str(node)]
            line = f"{env_prefix}{shlex.join(['bash', str(script)])} {' '.join(args)}"
            print(f"  node {node} ({role.name}): {' '.join([line, *map(shlex.quote, extra)])}")
    if layout.mode == "ray":
        print("start node 0 first: it starts the Ray head, the workers join it, and vLLM starts once all have joined")
    port = spec.serve.port
    print(f"clients: {endpoint(ADDRESS, port)} once node 0 answers {endpoint(ADDRESS, port, '/health')}")
    print("cluster=slurm starts the whole engine as one job: compile with cluster=slurm, then run this again")
    return EXIT_OK


LOCAL = LauncherRuntime(
    command=command,
    dry_run_lines=(),
    run=run,
    prints_node_commands=print_node_commands,
    ranks_ready=ranks_ready,
    smoke_checks=smoke_checks,
    engine_files=engine_files,
    start_serving=start_serving,
)
