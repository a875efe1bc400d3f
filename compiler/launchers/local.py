"""cluster.launcher=local: torchrun on this machine, started and stopped by `lmspec run` itself.

`lmspec run` runs launch/torchrun.sh in its own process group (Ctrl-C or SIGTERM stops the group with
SIGTERM, which the trainer turns into a checkpoint; runtime/launchers/local.py), and serve/serve.sh likewise.
A job on several nodes is started by hand on each: lmspec prints the per-node commands.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from typing import TYPE_CHECKING

from lmspec.compiler.build.files import SERVE_HEAD_SH, SERVE_SH, SERVE_WORKER_SH, VLLM_YAML
from lmspec.compiler.errors import Problem, warning
from lmspec.compiler.launchers.launcher import Launcher

if TYPE_CHECKING:
    from lmspec.compiler.plan import Plan
    from lmspec.compiler.rules.context import TrainingContext


def local_launcher_is_one_node(ctx: TrainingContext) -> Iterator[Problem]:
    s = ctx.spec
    if s.hardware.nodes > 1:
        yield warning(
            "cluster.launcher",
            (
                f"{ctx.show('cluster.launcher')} with {ctx.show('hardware.nodes')}: `lmspec run` starts this node "
                "only; run launch/torchrun.sh on every node with NODE_RANK and MASTER_ADDR, or use cluster=slurm"
            ),
        )


def serve_instructions(plan: Plan) -> str:
    """What to run where (runtime/launchers/local.py starts a one-node engine and prints the same per node)."""
    layout = plan.served().layout
    build = f"build/{plan.name}"
    if layout.nodes == 1:
        return f"`lmspec run {build} --stage serve` ({SERVE_SH} with {VLLM_YAML})"
    return (
        f"on node 0 `bash {build}/{SERVE_HEAD_SH} HEAD_ADDRESS`, on node k = 1..{layout.nodes - 1} "
        f"`bash {build}/{SERVE_WORKER_SH} HEAD_ADDRESS k` ({layout.mode}; HEAD_ADDRESS: node 0 as the others "
        f"reach it); `lmspec run {build} --stage serve` prints these"
    )


LOCAL = Launcher(
    name="local",
    section=None,
    rules=(),
    training_rules=(local_launcher_is_one_node,),
    runtime="lmspec.runtime.launchers.local:LOCAL",
    serve_instructions=serve_instructions,
    serve_files=(),
    files=None,
    carries=None,
    report=None,
    container=False,
    stop_signal=signal.SIGTERM,
    doctor_module=None,
)
