"""Estimated time of one training step: compute by roofline, plus the communication compute does not hide.

Plain arithmetic (no numpy import) that works on floats and numpy arrays alike, so one formula prices one
layout or a million. Per micro-batch, one GPU of the slowest pipeline stage runs its compute
(steptime_compute.py: GEMMs by roofline, core attention, memory-bound kernels) and the communication of
each parallel dimension that overlap leaves exposed (steptime_comm.py). This module adds them up: 1F1B idles
(pp - 1) micro-batch slots per step, interleaving v chunks (pp - 1) times its largest chunk's share of the
stage (1 / v when the layers split evenly); the DP traffic of the step; then
the optimizer update, memory-bound on the GPU's shard of the parameters. The inputs come from
steptime_inputs.py; the constants fitted to published runs are steptime_calibration.py's `CALIBRATION`
(bench/steptime_published.py fits and scores them, leaving each source out in turn, and `--fit` writes
steptime_calibration.json); every other constant is a count or a datasheet-derived ratio.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lmspec.compiler.models import larger, pick
from lmspec.compiler.models.comm import CommEstimate
from lmspec.compiler.models.steptime_calibration import CALIBRATION, Calibration
from lmspec.compiler.models.steptime_comm import dp_comm, micro_batch_comm
from lmspec.compiler.models.steptime_compute import micro_batch_compute
from lmspec.compiler.models.steptime_inputs import StepConstants, StepInputs, step_constants, step_inputs
from lmspec.compiler.models.train_memory import TrainMemory
from lmspec.compiler.spec.sections import TrainingSpec

# Optimizer update, bytes touched per parameter in the GPU's shard: read+write fp32 master,
# Adam m and v (24), read the fp32 gradient (4), write the bf16 weight (2).
OPTIMIZER_BYTES_PER_PARAM = 30
HBM_EFFICIENCY = 0.8  # of the datasheet HBM bandwidth an elementwise update reaches


@dataclass(frozen=True, kw_only=True)
class StepTime:
    """Seconds per step, by term (arrays when the inputs are): the exposed terms sum to the step time; the
    `*_raw` ones are each dimension's communication with nothing overlapped (plan.json's `comm`)."""

    compute: Any
    tp_comm: Any
    ep_comm: Any
    cp_comm: Any
    pp_comm: Any
    bubble: Any
    dp_comm: Any
    optimizer: Any
    tp_raw: Any
    ep_raw: Any
    cp_raw: Any
    pp_raw: Any
    dp_raw: Any

    @property
    def total(self) -> Any:
        return (
            self.compute
            + self.tp_comm
            + self.ep_comm
            + self.cp_comm
            + self.pp_comm
            + self.bubble
            + self.dp_comm
            + self.optimizer
        )

    @property
    def comm(self) -> Any:
        """Communication left exposed after overlap."""
        return self.tp_comm + self.ep_comm + self.cp_comm + self.pp_comm + self.dp_comm

    def unoverlapped(self) -> CommEstimate:
        """This step's communication with nothing overlapped, beside its compute (one layout's floats)."""
        return CommEstimate(
            tp_s=float(self.tp_raw),
            dp_s=float(self.dp_raw),
            ep_s=float(self.ep_raw),
            pp_s=float(self.pp_raw),
            cp_s=float(self.cp_raw),
            compute_s=float(self.compute),
        )


def largest_chunk_share(stage_layers: Any, virtual_stages: Any) -> Any:
    """The share of a stage's layers in its largest model chunk: each of the pp - 1 slots the pipeline idles
    waits for a chunk, and the first chunks take one more layer where a stage's layers do not split evenly
    (compiler/models/dims.py `chunk_layers`): ceil(L / v) / L, 1 / v on an even split, 1 without interleaving."""
    return -(-stage_layers // virtual_stages) / larger(stage_layers, 1)


def step_time(x: StepInputs, c: StepConstants, cal: Calibration = CALIBRATION) -> StepTime:
    """Seconds per training step of each candidate, split by term."""
    d = x.dims
    m, v = d.micro_batches, x.virtual_stages
    rows = x.tokens_per_micro_batch / d.cp  # tokens of every GEMM on one GPU
    tp_split = pick(x.sequence_parallel, d.tp, 1)
    compute = micro_batch_compute(x, c, cal, rows, tp_split)
    compute_mb = compute.total
    mb = micro_batch_comm(x, c, cal, rows, tp_split, compute)

    per_micro_batch = compute_mb + mb.tp_exposed + mb.ep_exposed + mb.cp_exposed + mb.pp
    dp_exposed, dp_raw = dp_comm(x, c, compute_mb)
    sharded = (x.distributed_optimizer != 0) | (x.zero_stage > 0)  # each rank updates its shard only
    local = x.dense_params / pick(sharded, d.dense_dp, 1) + x.expert_params / pick(sharded, d.expert_dp, 1)
    optimizer = local * OPTIMIZER_BYTES_PER_PARAM / (c.hbm_bytes_per_s * HBM_EFFICIENCY)
    return StepTime(
        compute=m * compute_mb,
        tp_comm=m * mb.tp_exposed,
        ep_comm=m * mb.ep_exposed,
        cp_comm=m * mb.cp_exposed,
        pp_comm=m * mb.pp,
        bubble=(d.pp - 1) * largest_chunk_share(x.stage_layers, v) * per_micro_batch,
        dp_comm=dp_exposed,
        optimizer=optimizer,
        tp_raw=m * mb.tp,
        ep_raw=m * mb.ep,
        cp_raw=m * mb.cp,
        pp_raw=m * v * mb.pp,
        dp_raw=dp_raw,
    )


def estimate_step_time(spec: TrainingSpec, memory: TrainMemory) -> StepTime | None:
    """The step time of the spec's own layout, as `lmspec plan` prices that layout among its candidates."""
    inputs = step_inputs(spec, memory)
    return step_time(inputs, step_constants(spec)) if inputs is not None else None


def estimate_comm_and_step(spec: TrainingSpec, memory: TrainMemory) -> tuple[CommEstimate, StepTime] | None:
    """The step time of the spec's own layout, and its communication with nothing overlapped beside that
    step's compute: one computation behind plan.json, REPORT.md, explain and the communication warning."""
    step = estimate_step_time(spec, memory)
    return (step.unoverlapped(), step) if step is not None else None
