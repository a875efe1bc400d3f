"""Tokens/s, MFU and HFU per logged step, with the Plan's FLOPs per token (lmspec.compiler.models.flops:
Megatron's `num_floating_point_operations` per token), and the seed's verdicts on MFU."""

from __future__ import annotations

import math
from dataclasses import dataclass

from lmspec.compiler.observe.logs.context import RunContext
from lmspec.compiler.observe.metrics_record import StepMetrics

MFU_COMM_BOUND_BELOW = 0.20  # the seed: < 20% means communication or data loading dominate
MFU_HEALTHY_LOW, MFU_HEALTHY_HIGH = 0.40, 0.60  # the seed: 40-60% is a healthy large run


@dataclass(frozen=True)
class StepRates:
    """What one step achieved; None where the log and the context do not tell."""

    step: int
    tokens_per_s: float | None
    mfu: float | None  # fraction of peak, model FLOPs
    hfu: float | None  # fraction of peak, model + recomputed FLOPs


def tokens_per_s(record: StepMetrics, context: RunContext | None, log_seq_length: int | None) -> float | None:
    """As logged (torchtitan's per device, times the job's GPUs), else from samples/s or the step time
    and the global batch the log states (else the job's tokens per step); the job's sequence length
    (else the one given or printed at start-up)."""
    if record.tokens_per_s is not None:
        return record.tokens_per_s
    if record.tokens_per_s_per_gpu is not None and context is not None:
        return record.tokens_per_s_per_gpu * context.n_gpus
    seq = context.seq_length if context is not None else log_seq_length
    if seq is None:
        return None
    if record.samples_per_s is not None:
        return record.samples_per_s * seq
    if record.step_time_s:
        if record.global_batch_size:
            return record.global_batch_size * seq / record.step_time_s
        if context is not None:
            return context.tokens_per_step / record.step_time_s
    return None


def rates_of(record: StepMetrics, context: RunContext | None, log_seq_length: int | None) -> StepRates:
    """What one step achieved."""
    tps = tokens_per_s(record, context, log_seq_length)
    mfu = hfu = None
    if context is not None and tps is not None:
        from lmspec.compiler.models.flops import mfu as mfu_of

        mfu = mfu_of(tps, context.flops_per_token, context.n_gpus, context.peak_tflops_per_gpu)
        hfu = mfu_of(tps, context.hardware_flops_per_token, context.n_gpus, context.peak_tflops_per_gpu)
    elif record.mfu is not None and math.isfinite(record.mfu):
        mfu = record.mfu  # lmspec's runtime computed it from the same FLOPs model
    return StepRates(step=record.step, tokens_per_s=tps, mfu=mfu, hfu=hfu)


def verdict(mfu: float) -> str:
    """The seed's reading of an MFU figure."""
    if mfu < MFU_COMM_BOUND_BELOW:
        return (
            f"MFU {mfu:.1%} < {MFU_COMM_BOUND_BELOW:.0%}: communication or data bound — check TP "
            "across nodes, the comm share in `lmspec explain`, and the data loader (`lmspec doctor`)"
        )
    if mfu < MFU_HEALTHY_LOW:
        return (
            f"MFU {mfu:.1%}: below the {MFU_HEALTHY_LOW:.0%}-{MFU_HEALTHY_HIGH:.0%} of a healthy run; "
            "larger micro batch, less recompute or lower TP may help"
        )
    if mfu <= MFU_HEALTHY_HIGH:
        return f"MFU {mfu:.1%}: healthy ({MFU_HEALTHY_LOW:.0%}-{MFU_HEALTHY_HIGH:.0%})"
    return (
        f"MFU {mfu:.1%}: above what training usually reaches; check the GPU peak "
        "(hardware.gpu.bf16_tflops), the GPU count and the sequence length given"
    )


def cpu_note(mfu: float) -> str:
    """A CPU run's MFU, without the GPU thresholds above: a CPU preset's peak is nominal, and its
    ranks talk over shared memory, so neither "communication bound" nor "healthy" means anything."""
    return f"MFU {mfu:.1%} on a CPU preset: no verdict (the GPU thresholds do not apply to CPU ranks)"
