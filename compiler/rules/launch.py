"""Rules of the launch artifacts: what sbatch, NCCL and DeepSpeed's scheduler will really do.

The strings placed in them (Slurm names and times, interface and RDMA device names) are
checked by their kinds (lmspec.compiler.spec.kinds) in the schema, before any rule runs."""

from __future__ import annotations

from collections.abc import Iterator

from lmspec.compiler.errors import Problem, error, warning
from lmspec.compiler.rules.context import RuleContext, TrainingContext

DEEPSPEED_MIN_WARMUP_STEPS = 2  # DeepSpeed's Warmup* schedulers use max(2, warmup_num_steps)
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


def local_launcher_is_one_node(ctx: TrainingContext) -> Iterator[Problem]:
    s = ctx.spec
    if s.cluster.launcher == "local" and s.hardware.nodes > 1:
        yield warning(
            "cluster.launcher",
            (
                f"{ctx.show('cluster.launcher')} with {ctx.show('hardware.nodes')}: `lmspec run` starts this node "
                "only; run launch/torchrun.sh on every node with NODE_RANK and MASTER_ADDR, or use cluster=slurm"
            ),
        )


def deepspeed_schedule(ctx: TrainingContext) -> Iterator[Problem]:
    t = ctx.spec.train
    if t.backend != "deepspeed":
        return
    if t.lr_schedule.decay == "linear" and t.optimizer.min_lr > 0:
        yield warning(
            "train.optimizer.min_lr",
            (
                f"{ctx.show('train.optimizer.min_lr')} is ignored with {ctx.show('train.lr_schedule.decay')} on "
                "DeepSpeed: its WarmupDecayLR decays to 0; use train.lr_schedule.decay=cosine to end at min_lr"
            ),
        )
    if t.lr_schedule.warmup_steps < DEEPSPEED_MIN_WARMUP_STEPS:
        yield warning(
            "train.lr_schedule.warmup_steps",
            (
                f"{ctx.show('train.lr_schedule.warmup_steps')}: DeepSpeed's schedulers warm up for at least "
                f"{DEEPSPEED_MIN_WARMUP_STEPS} steps; set train.lr_schedule.warmup_steps={DEEPSPEED_MIN_WARMUP_STEPS} "
                "to say so in the spec"
            ),
        )


RULES = (slurm_signal_before_time_limit, roce_gid_index)
TRAINING_RULES = (local_launcher_is_one_node, deepspeed_schedule)
