"""cluster.launcher=local: torchrun on this machine, started and stopped by `lmspec run` itself.

`lmspec run` runs launch/torchrun.sh in its own process group (Ctrl-C or SIGTERM stops the group with
SIGTERM, which the trainer turns into a checkpoint; runtime/train/launch.py), and serve/serve.sh likewise.
A job on several nodes is started by hand on each: lmspec prints the per-node commands.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from typing import TYPE_CHECKING

from lmspec.compiler.errors import Problem, warning
from lmspec.compiler.launchers.launcher import Launcher

if TYPE_CHECKING:
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


LOCAL = Launcher(
    name="local",
    section=None,
    rules=(),
    training_rules=(local_launcher_is_one_node,),
    batch_job=False,
    serve_files=(),
    container=False,
    stop_signal=signal.SIGTERM,
    doctor_module=None,
)
