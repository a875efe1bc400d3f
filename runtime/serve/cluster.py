"""The serve stage of an engine `lmspec run` does not start itself: one on several nodes, or one under Slurm.

A multi-node engine (compiler/models/serve_layout.py: layout.nodes > 1) on cluster.launcher=local is
started by hand on every node, so the stage prints each node's command (serve/head.sh on node 0,
serve/worker.sh on the others), where to run it from, and the endpoint clients use, then exits 0:
starting a one-node engine for it would serve another layout than the one compiled and budgeted.
On cluster.launcher=slurm the whole engine, one node or many, is one job: serve/sbatch.sh is
submitted (runtime/slurm.py), its job id and the way to its endpoint printed; the engine serves
until the job is cancelled. Every script a node runs is checked against manifest.json first.
"""

from __future__ import annotations

import shlex

from lmspec.compiler.build.files import (
    NCCL_ENV,
    SERVE_HEAD_SH,
    SERVE_SBATCH_SH,
    SERVE_WORKER_SH,
    VLLM_YAML,
    serve_scripts,
)
from lmspec.compiler.build.reader import Build
from lmspec.compiler.endpoint import endpoint
from lmspec.compiler.errors import EXIT_OK
from lmspec.compiler.launchers import launcher_of
from lmspec.compiler.launchers.launcher import Launcher
from lmspec.compiler.models.serve_layout import ServeLayout
from lmspec.runtime.slurm import sbatch_command, sbatch_test_command, submit
from lmspec.runtime.smoke_checks import Check, run_checks

ADDRESS = "ADDRESS"  # placeholder for node 0's address as the other nodes reach it


def engine_files(layout: ServeLayout, launcher: Launcher) -> tuple[str, ...]:
    """What bash and vLLM read: the launcher's own serve files (sbatch.sh under Slurm), then a one-node
    engine's serve.sh, or head.sh + worker.sh (which source the build's network settings, as a batch job does)."""
    network = (NCCL_ENV,) if launcher.batch_job or layout.nodes > 1 else ()
    return (*launcher.serve_files, *serve_scripts(layout.nodes), *network, VLLM_YAML)


def print_node_commands(build: Build, env_prefix: str, extra: list[str]) -> int:
    """What to run on each node of a multi-node engine (cluster.launcher=local); starts nothing."""
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


def submit_engine(
    build: Build, env: dict[str, str], env_prefix: str, extra: list[str], *, dry_run: bool, smoke: bool
) -> int:
    """serve/sbatch.sh submitted (cluster.launcher=slurm): the engine runs until its job is cancelled;
    `extra` vLLM flags go to every node's script. `smoke`: the scripts parse and Slurm would accept
    the job (sbatch --test-only); nothing is submitted."""
    spec, root = build.serving(), build.root.resolve()
    args = (str(root), *extra)
    command = sbatch_command(root / SERVE_SBATCH_SH, args, wait=False)
    if dry_run:
        print(env_prefix + shlex.join(command))
        return EXIT_OK
    if smoke:
        files = engine_files(build.plan.served().layout, launcher_of(spec.cluster))
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
    print(
        f"submitted Slurm job {job_id}: vLLM on {build.plan.served().layout.nodes} node(s), logging to "
        f"serve-{spec.name}-{job_id}-node<N>.log here; clients: {endpoint(host, spec.serve.port)} with {host} the "
        f"job's first node (`squeue --noheader --jobs {job_id} --format %N` lists them) once "
        f"{endpoint(host, spec.serve.port, '/health')} answers; `scancel {job_id}` stops it",
        flush=True,
    )
    return EXIT_OK
