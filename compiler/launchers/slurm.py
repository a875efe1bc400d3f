"""cluster.launcher=slurm: the job goes to Slurm as one batch script that starts every node.

`lmspec run` submits launch/sbatch.sh (serve/sbatch.sh for serving) and follows the job
(runtime/launchers/slurm.py, runtime/slurm.py). Before the time limit Slurm sends
USR1 to the batch shell (`--signal=B:USR1@N`, compiler/emit/launch.py), which forwards it to every task:
the trainer checkpoints and exits for requeue. cluster.slurm is read by this launcher alone; its
container runs on srun through pyxis (compiler/emit/site.py).
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from typing import TYPE_CHECKING

from lmspec.compiler.build.files import SERVE_SBATCH_SH
from lmspec.compiler.errors import Problem, error
from lmspec.compiler.launchers.container import setup_runs_in_the_image, workdir_is_mounted
from lmspec.compiler.launchers.launcher import Launcher

if TYPE_CHECKING:
    from lmspec.compiler.plan import Plan
    from lmspec.compiler.rules.context import RuleContext
    from lmspec.compiler.spec.sections import Spec

NAME = "slurm"

SECONDS_PER = {"days": 86400, "hours": 3600, "minutes": 60, "seconds": 1}


def time_limit_seconds(limit: str) -> int:
    """`[D-]HH:MM:SS` (lmspec.compiler.spec.kinds.SLURM_TIME, ASCII digits only) in seconds."""
    days, _, clock = limit.rpartition("-")
    hours, minutes, seconds = (int(part) for part in clock.split(":"))
    return (
        int(days or 0) * SECONDS_PER["days"] + hours * SECONDS_PER["hours"] + minutes * SECONDS_PER["minutes"] + seconds
    )


def slurm_signal_before_time_limit(ctx: RuleContext) -> Iterator[Problem]:
    slurm = ctx.spec.cluster.slurm
    limit_s = time_limit_seconds(slurm.time)
    if slurm.signal_seconds >= limit_s:
        yield error(
            "cluster.slurm.signal_seconds",
            (
                f"{ctx.show('cluster.slurm.signal_seconds')} is not shorter than {ctx.show('cluster.slurm.time')} "
                f"({limit_s} s): the pre-timeout checkpoint signal would come before training starts; "
                f"use a value below {limit_s}, e.g. {max(1, limit_s // 10)}"
            ),
        )


def chosen(spec: Spec) -> bool:
    """Whether this is the spec's launcher: only then does its container run anything."""
    return spec.cluster.launcher == NAME


def setup_outside_the_image(ctx: RuleContext) -> Iterator[Problem]:
    image = ctx.spec.cluster.slurm.container.image
    if chosen(ctx.spec) and image is not None:
        yield from setup_runs_in_the_image(ctx, "cluster.slurm.container.image", image)


def container_workdir_is_mounted(ctx: RuleContext) -> Iterator[Problem]:
    if chosen(ctx.spec):
        yield from workdir_is_mounted(ctx)


def serve_instructions(plan: Plan) -> str:
    nodes = plan.served().layout.nodes
    return f"`lmspec run build/{plan.name} --stage serve` (submits {SERVE_SBATCH_SH}: {nodes} node(s))"


SLURM = Launcher(
    name=NAME,
    section="cluster.slurm",
    rules=(slurm_signal_before_time_limit, setup_outside_the_image, container_workdir_is_mounted),
    training_rules=(),
    runtime="lmspec.runtime.launchers.slurm:SLURM",
    serve_instructions=serve_instructions,
    serve_files=(SERVE_SBATCH_SH,),
    files=None,
    carries=None,
    report=None,
    container=True,
    stop_signal=signal.SIGUSR1,
    doctor_module="lmspec.compiler.observe.doctor.slurm",
)
