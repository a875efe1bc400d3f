"""Checkpoint saves against the run: what a save stops training for must end inside the collective timeout
(NCCL's watchdog kills the job when one wait outlasts cluster.nccl.timeout_minutes); the staged copies must
fit the nodes' host memory; and the interval should not lose much more of the run than Young's
(compiler/models/checkpoint_size.py prices all three)."""

from __future__ import annotations

import math
from collections.abc import Iterator

from lmspec.compiler.errors import Problem, error, warning
from lmspec.compiler.models.checkpoint_size import (
    CheckpointCadence,
    CheckpointSize,
    checkpoint_cadence,
    checkpoint_size,
)
from lmspec.compiler.models.steptime import estimate_step_time
from lmspec.compiler.models.units import GB, GIB, SECONDS_PER_MINUTE, TB
from lmspec.compiler.rules.budget import computable, estimate
from lmspec.compiler.rules.context import TrainingContext

TIMEOUT_KEY = "cluster.nccl.timeout_minutes"
BANDWIDTH_KEY = "cluster.storage_write_gb_per_s"
ASYNC_KEY = "train.checkpoint.async_save"
INTERVAL_KEY = "train.checkpoint.interval"
HOST_KEY = "hardware.host_memory_gib"
MTBF_KEY = "cluster.node_mtbf_hours"
# The interval warning fires when train.checkpoint.interval loses this much more of the run's time than
# the advised interval: 1% of a large run is days of its GPUs; less is within the estimate's error.
INTERVAL_WARNING_SHARE = 0.01


def _size(n_bytes: float) -> str:
    return f"{n_bytes / TB:,.2f} TB" if n_bytes >= TB else f"{n_bytes / GB:,.1f} GB"


def _seconds(s: float) -> str:
    return f"{s:,.0f} s ({s / SECONDS_PER_MINUTE:,.1f} min)" if s >= 1 else f"{s:.3g} s"


def cadence(ctx: TrainingContext, c: CheckpointSize) -> CheckpointCadence | None:
    """The saves at the estimated step time; None where the layout has no step estimate."""
    memory = estimate(ctx.spec)
    step = estimate_step_time(ctx.spec, memory) if memory is not None else None
    return checkpoint_cadence(c, ctx.spec, float(step.total)) if step is not None else None


def _fixes(ctx: TrainingContext, c: CheckpointSize, exposed_s: float, wait_s: float) -> list[str]:
    minutes = math.ceil(exposed_s / SECONDS_PER_MINUTE)
    fixes = [f"raise {TIMEOUT_KEY} to {minutes} or more (the watchdog then also waits that long on a real hang)"]
    if not c.async_save:
        fixes.append(
            f"set {ASYNC_KEY}=true (train.backend=megatron): training then stops only to stage "
            f"{_size(c.bytes_per_rank)} per rank in host memory ({_seconds(c.staging_s)}) while the write "
            "continues in the background"
        )
    left = c.timeout_s - c.staging_s
    if left > 0:
        needed = c.bytes_per_save / left / GB
        fixes.append(
            f"put train.checkpoint.dir on storage that writes {needed:,.1f} GB/s or more and set {BANDWIDTH_KEY} "
            "to what it sustains"
        )
    if wait_s > 0:
        fixes.append(f"raise {INTERVAL_KEY}, so that a save's persist ends before the next save starts")
    return fixes


def checkpoint_save_within_timeout(ctx: TrainingContext) -> Iterator[Problem]:
    """A warning: what one save stops training for outlasts the collective timeout. Synchronous, that is the
    staging and the whole persist; asynchronous, the staging and any wait for the previous save's persist."""
    if not computable(ctx.spec):
        return
    c = checkpoint_size(ctx.spec)
    timed = cadence(ctx, c)
    exposed = timed.exposed_per_save_s if timed is not None else c.exposed_s
    if exposed <= c.timeout_s:
        return
    wait = timed.wait_s if timed is not None else 0.0
    what = (
        f"writes {_size(c.bytes_per_save)} ({c.params:,} parameters x {c.bytes_per_param} B of weights and "
        f"optimizer state): each rank stages its share of {_size(c.bytes_per_rank)} in host memory in "
        f"{_seconds(c.staging_s)}, then the {c.ranks:,} ranks write it in {_seconds(c.write_s)} at "
        f"{ctx.show(BANDWIDTH_KEY)}"
    )
    if c.async_save and timed is not None:
        what += (
            f"; with {ctx.show(ASYNC_KEY)} that persist runs in the background, but it outlasts "
            f"{ctx.show(INTERVAL_KEY)} ({_seconds(timed.interval_s)} at the estimated {timed.step_s:.3g} s per "
            f"step), so each save first waits {_seconds(wait)} for the previous one"
        )
    else:
        what += f", while every rank waits ({ctx.show(ASYNC_KEY)})"
    yield warning(
        TIMEOUT_KEY,
        (
            f"a checkpoint save stops training in a collective for {_seconds(exposed)}, longer than "
            f"{ctx.show(TIMEOUT_KEY)}: it {what}; fixes: {'; '.join(_fixes(ctx, c, exposed, wait))}"
        ),
    )


def staged_save_fits_host_memory(ctx: TrainingContext) -> Iterator[Problem]:
    """An error: a node's ranks stage their shares of a save in host memory, beside what the ranks keep there
    (offloaded state; on CPU ranks, all their training memory), and together they exceed hardware.host_memory_gib."""
    hw = ctx.spec.hardware
    if not computable(ctx.spec) or hw.host_memory_gib is None:
        return
    c = checkpoint_size(ctx.spec)
    memory = estimate(ctx.spec)
    if memory is None:
        return
    on_cpu = hw.gpu.generation == "cpu"
    resident = max((s.total_bytes if on_cpu else s.host_bytes) for s in memory.stages) * hw.gpus_per_node
    needed = c.host_bytes_per_node + resident
    if c.host_memory_bytes is None or needed <= c.host_memory_bytes:
        return
    held = "their training memory" if on_cpu else "offloaded state"
    beside = f" beside {resident / GIB:,.1f} GiB the ranks hold there ({held})" if resident else ""
    nodes = math.ceil(hw.nodes * c.host_bytes_per_node / max(c.host_memory_bytes - resident, 1))
    fixes = [f"set {HOST_KEY} to what the nodes have, if it is more"]
    if c.host_memory_bytes > resident:
        fixes.append(f"spread the save over more ranks: hardware.nodes={nodes} or more")
    if resident and not on_cpu:
        fixes.append("offload less: parallel.offload_params=false or parallel.offload_optimizer=false")
    yield error(
        HOST_KEY,
        (
            f"a checkpoint save stages {c.bytes_per_rank / GIB:,.1f} GiB per rank, "
            f"{c.host_bytes_per_node / GIB:,.1f} GiB per node of hardware.gpus_per_node={hw.gpus_per_node} "
            f"({_size(c.bytes_per_save)} over {c.ranks:,} ranks) in host memory{beside}: more than "
            f"{ctx.show(HOST_KEY)}; fixes: {'; '.join(fixes)}"
        ),
    )


def advice_text(timed: CheckpointCadence) -> str:
    """How the advised interval was found (CheckpointCadence.advice)."""
    young = f"Young/Daly: sqrt(2 x save cost x job MTBF) - save cost = {_seconds(timed.young_interval_s)}"
    if timed.advice == "persist":
        return f"{young}, raised to the persist, {_seconds(timed.advised_interval_s)}, below which a save waits for it"
    return young


def checkpoint_interval_near_advice(ctx: TrainingContext) -> Iterator[Problem]:
    """A warning: train.checkpoint.interval loses INTERVAL_WARNING_SHARE or more of the run's time beyond
    the Young/Daly interval (saves stopping training, plus the work redone after each interruption)."""
    if not computable(ctx.spec):
        return
    c = checkpoint_size(ctx.spec)
    timed = cadence(ctx, c)
    if timed is None or timed.lost_share - timed.advised_lost_share < INTERVAL_WARNING_SHARE:
        return
    hours = timed.job_mtbf_s / 3600
    yield warning(
        INTERVAL_KEY,
        (
            f"{ctx.show(INTERVAL_KEY)} loses {timed.lost_share:.1%} of the run's time, "
            f"{timed.advised_lost_share:.1%} at every {timed.advised_interval_steps:,} steps: a save stops training "
            f"for {_seconds(timed.exposed_per_save_s)} every {_seconds(timed.interval_s)} "
            f"({timed.step_s:.3g} s per step, estimated), and an interruption every {hours:,.1f} h "
            f"({ctx.show(MTBF_KEY)} / hardware.nodes={ctx.spec.hardware.nodes}) redoes half an interval; set "
            f"{INTERVAL_KEY}={timed.advised_interval_steps} ({advice_text(timed)})"
        ),
    )


RULES = (checkpoint_save_within_timeout, staged_save_fits_host_memory, checkpoint_interval_near_advice)
