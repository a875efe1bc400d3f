"""A parsed log summarised over its steady steps: as data (JSON) and as text."""

from __future__ import annotations

import dataclasses
import json
import math
from array import array
from dataclasses import dataclass

from lmspec.compiler.models.units import GIB
from lmspec.compiler.observe.logs.context import RunContext
from lmspec.compiler.observe.logs.records import ParsedLog
from lmspec.compiler.observe.logs.stats import Summary, skips_warmup, summarize
from lmspec.compiler.observe.logs.throughput import cpu_note, rates_of, verdict

# the metrics of a report, in the order they are summarised (tokens_per_s_per_gpu with a job)
_SERIES = (
    "step_time_s",
    "tokens_per_s",
    "mfu",
    "hfu",
    "loss",
    "grad_norm",
    "logged_tflops_per_gpu",
    "logged_tokens_per_s_per_gpu",
)


@dataclass(frozen=True)
class LogReport:
    log: str
    formats: list[str]
    steps_logged: int
    steps_used: int
    warmup_steps: int
    warmup_applied: bool  # False when skipping warm-up would have left no step
    job: str | None
    flops_per_token: float | None
    hardware_flops_per_token: float | None
    metrics: dict[str, Summary]
    last_loss: float | None
    peak_memory_bytes: int | None
    gpu_memory_bytes: int | None
    verdict: str | None
    warnings: list[str]  # where the log's own start-up settings disagree with the job given

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True, allow_nan=True)


def build_report(parsed: ParsedLog, context: RunContext | None, warmup_steps: int) -> LogReport:
    """The report over the log's steady steps, in one pass over its steps (never all at once)."""
    table = parsed.table
    applied = skips_warmup(table.max_step, warmup_steps)  # steady_steps' rule, over every step seen
    seq = parsed.settings.get("seq_length")
    series: dict[str, array] = {name: array("d") for name in _SERIES}
    appends = [series[name].append for name in _SERIES]
    used = 0
    peak: int | None = None
    last_loss: float | None = None
    last_loss_step: int | None = None
    for record in parsed.records():
        if record.peak_memory_bytes is not None and (peak is None or record.peak_memory_bytes > peak):
            peak = record.peak_memory_bytes  # max() of the steps' peaks, in step order
        if record.loss is not None:
            last_loss, last_loss_step = record.loss, record.step
        if applied and record.step <= warmup_steps:
            continue
        used += 1
        rate = rates_of(record, context, seq)
        values = (  # in _SERIES order
            record.step_time_s,
            rate.tokens_per_s,
            rate.mfu,
            rate.hfu,
            record.loss,
            record.grad_norm,
            record.tflops_per_gpu,
            record.tokens_per_s_per_gpu,
        )
        for append, value in zip(appends, values, strict=True):
            if value is not None:
                append(value)
    if table.dropped:  # a sampled table: what the steps left out of the sample add
        used += table.dropped_above if applied else table.dropped
        if table.dropped_peak is not None and (peak is None or table.dropped_peak > peak):
            peak = table.dropped_peak
        dropped = table.dropped_last_loss
        if dropped is not None and (last_loss_step is None or dropped[0] > last_loss_step):
            last_loss = dropped[1]
    if parsed.peak_memory_bytes is not None and (peak is None or parsed.peak_memory_bytes > peak):
        peak = parsed.peak_memory_bytes
    if context is not None:
        series["tokens_per_s_per_gpu"] = array("d", (t / context.n_gpus for t in series["tokens_per_s"]))
    metrics = {name: summary for name, values in series.items() if (summary := summarize(values))}
    mfu = metrics.get("mfu")
    return LogReport(
        log=parsed.path,
        formats=parsed.formats,
        steps_logged=table.distinct,
        steps_used=used,
        warmup_steps=warmup_steps,
        warmup_applied=applied,
        job=_job(context),
        flops_per_token=context.flops_per_token if context else None,
        hardware_flops_per_token=context.hardware_flops_per_token if context else None,
        metrics=metrics,
        last_loss=last_loss,
        peak_memory_bytes=peak,
        gpu_memory_bytes=int(context.spec.hardware.gpu.memory_gib * GIB) if context else None,
        verdict=(verdict(mfu.mean) if context is None or context.plan.device == "gpu" else cpu_note(mfu.mean))
        if mfu
        else None,
        warnings=_broken_rules(context) + _mismatches(parsed.settings, context) + parsed.notes,
    )


def _broken_rules(context: RunContext | None) -> list[str]:
    """What lmspec would refuse to compile in a job given by flags (its numbers are used all the same)."""
    if context is None:
        return []
    return [
        f"the job given breaks a rule (its numbers are used anyway): {p.line()}"
        for p in context.plan.warnings
        if p.severity == "error"
    ]


def _mismatches(settings: dict[str, int], context: RunContext | None) -> list[str]:
    if context is None:
        return []
    spec, layout = context.training, context.plan.trained().layout
    job = {
        "seq_length": ("train.seq_length", spec.train.seq_length),
        "global_batch_size": ("train.global_batch_size", spec.train.global_batch_size),
        "micro_batch_size": ("train.micro_batch_size", spec.train.micro_batch_size),
        "world_size": ("GPUs", context.n_gpus),
        "tp": ("parallel.tp", layout.tp),
        "pp": ("parallel.pp", layout.pp),
    }
    return [
        f"the log ran {name}={value} but the job given has {job[name][0]}={job[name][1]}: "
        "is --build (or --model/--gpus/--set) the job that wrote this log?"
        for name, value in sorted(settings.items())
        if name in job and job[name][1] != value
    ]


def _job(context: RunContext | None) -> str | None:
    if context is None:
        return None
    s = context.training
    return (
        f"{s.model.name} on {context.n_gpus} x {s.hardware.gpu.name} "
        f"({context.peak_tflops_per_gpu:g} TFLOP/s bf16 peak), seq {s.train.seq_length}, "
        f"global batch {s.train.global_batch_size}, recompute {s.train.recompute} [{context.origin}]"
    )


_LABELS = {
    "step_time_s": "step time (s)",
    "tokens_per_s": "tokens/s",
    "tokens_per_s_per_gpu": "tokens/s/GPU",
    "mfu": "MFU",
    "hfu": "HFU",
    "loss": "loss",
    "grad_norm": "grad norm",
    "logged_tflops_per_gpu": "TFLOP/s/GPU (as logged)",
    "logged_tokens_per_s_per_gpu": "tokens/s/GPU (as logged)",
}
_PERCENT = ("mfu", "hfu")


def _cell(name: str, value: float) -> str:
    if not math.isfinite(value):
        return str(value)
    return f"{value:.1%}" if name in _PERCENT else f"{value:.4g}"


def format_text(report: LogReport) -> str:
    lines = [
        f"log: {report.log} ({', '.join(report.formats) or 'no known format'}): "
        f"{report.steps_logged} logged steps, {report.steps_used} used"
    ]
    if not report.warmup_applied:
        lines.append(f"  warm-up skip (steps <= {report.warmup_steps}) would leave no step: all steps used")
    elif report.steps_used < report.steps_logged:
        lines.append(f"  warm-up: steps <= {report.warmup_steps} skipped (--warmup-steps)")
    lines += [f"warning: {w}" for w in report.warnings]
    if report.job:
        lines.append(f"job: {report.job}")
        lines.append(
            f"model FLOPs/token {report.flops_per_token:.4g}, with recompute {report.hardware_flops_per_token:.4g}"
        )
    else:
        lines.append("job: unknown (give --build DIR or --model/--hardware/--gpus for tokens/s and MFU)")
    if report.metrics:
        lines.append(f"{'metric':<24}{'mean':>10}{'p50':>10}{'p90':>10}{'min':>10}{'max':>10}")
        for name, label in _LABELS.items():
            s = report.metrics.get(name)
            if s:
                cells = "".join(f"{_cell(name, v):>10}" for v in (s.mean, s.p50, s.p90, s.minimum, s.maximum))
                lines.append(f"{label:<24}{cells}")
    if report.last_loss is not None:
        lines.append(f"last loss: {report.last_loss:.4g}")
    if report.peak_memory_bytes is not None:
        budget = f" of {report.gpu_memory_bytes / GIB:.0f} GiB" if report.gpu_memory_bytes else ""
        lines.append(f"peak memory: {report.peak_memory_bytes / GIB:.2f} GiB{budget}")
    if report.verdict:
        lines.append(f"verdict: {report.verdict}")
    return "\n".join(lines)
