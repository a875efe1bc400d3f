"""Rules of the launch artifacts: what NCCL will really do, and each launcher's own.

A launcher's rules (sbatch's time limit, a local job's one node) live in its module
(lmspec.compiler.launchers); the two tables below run them, so no rule here compares launcher names.

The strings placed in them (Slurm names and times, interface and RDMA device names) are
checked by their kinds (lmspec.compiler.spec.kinds) in the schema, before any rule runs."""

from __future__ import annotations

from collections.abc import Iterator

from lmspec.compiler.errors import Problem, warning
from lmspec.compiler.launchers import LAUNCHERS, launcher_of
from lmspec.compiler.rules.context import RuleContext, TrainingContext


def roce_gid_index(ctx: RuleContext) -> Iterator[Problem]:
    fabric, gid = ctx.spec.hardware.inter_node.fabric, ctx.spec.cluster.nccl.ib_gid_index
    if fabric == "roce" and gid is None and ctx.spec.hardware.nodes > 1:
        yield warning(
            "cluster.nccl.ib_gid_index",
            (
                f"{ctx.show('cluster.nccl.ib_gid_index')} with {ctx.show('hardware.inter_node.fabric')}: NCCL may pick "
                "a RoCEv1 or IPv6 GID and hang between nodes; set cluster.nccl.ib_gid_index=3 (RoCEv2 on most NICs)"
            ),
        )
    if fabric != "roce" and gid is not None:
        yield warning(
            "cluster.nccl.ib_gid_index",
            (
                f"{ctx.show('cluster.nccl.ib_gid_index')} is ignored with {ctx.show('hardware.inter_node.fabric')} "
                "(RoCE only); set cluster.nccl.ib_gid_index=null"
            ),
        )


def chosen_launcher(ctx: TrainingContext) -> Iterator[Problem]:
    """The training rules of the spec's own launcher (lmspec.compiler.launchers: each module declares its own)."""
    for rule in launcher_of(ctx.spec.cluster).training_rules:
        yield from rule(ctx)


# every launcher's rules on its own section first (each spec has every section), then the fabric's
RULES = (*(rule for launcher in LAUNCHERS.values() for rule in launcher.rules), roce_gid_index)
TRAINING_RULES = (chosen_launcher,)
