"""Find the steps in a log file or run directory, whatever wrote it."""

from __future__ import annotations

from pathlib import Path

from compiler.errors import UsageError
from compiler.logs.deepspeed import parse_deepspeed_line
from compiler.logs.jsonl import parse_jsonl_line
from compiler.logs.launcher import strip_prefix
from compiler.logs.lmspec_text import parse_lmspec_line
from compiler.logs.megatron import parse_megatron_line, parse_megatron_memory
from compiler.logs.records import ParsedLog, StepRecord
from compiler.logs.settings import parse_setting
from compiler.logs.user_regex import compile_user_regex, parse_user_line

METRICS_FILE = "metrics.jsonl"
# What a run directory may hold, in the order looked for.
RUN_DIR_LOGS: tuple[str, ...] = (METRICS_FILE, "train.log", "stdout.log", "stderr.log")


def resolve_log(path: Path) -> Path:
    """A log file itself, or the first known log inside a run directory."""
    if path.is_dir():
        for name in RUN_DIR_LOGS:
            if (path / name).is_file():
                return path / name
        raise UsageError(f"{path} holds none of {', '.join(RUN_DIR_LOGS)}; pass the log file itself")
    if not path.is_file():
        raise UsageError(f"{path}: no such log file or run directory")
    return path


def read_raw_lines(path: Path) -> list[str]:
    """The log's lines as written (the last redraw of a progress bar; bytes not UTF-8 replaced)."""
    text = resolve_log(path).read_text(encoding="utf-8", errors="replace")
    return [line.rsplit("\r", 1)[-1] for line in text.splitlines()]


def read_lines(path: Path) -> list[str]:
    """The log's lines as each rank printed them: launcher prefixes stripped."""
    return [strip_prefix(line) for line in read_raw_lines(path)]


def _is_jsonl(lines: list[str]) -> bool:
    first = next((line for line in lines if line.strip()), "")
    return first.lstrip().startswith("{")


def parse_lines(lines: list[str], source: str, regex: str | None = None) -> ParsedLog:
    log = ParsedLog(path=source)
    by_step: dict[int, StepRecord] = {}
    user = compile_user_regex(regex) if regex else None
    jsonl = user is None and _is_jsonl(lines)
    for lineno, text in enumerate(lines, start=1):
        if user is not None:
            record, kind = parse_user_line(user, text, lineno, len(by_step) + 1), "regex"
        elif jsonl:
            record, kind = parse_jsonl_line(text, lineno), "lmspec-jsonl"
        else:
            record, kind = parse_megatron_line(text, lineno), "megatron"
            if record is None:
                record, kind = parse_deepspeed_line(text, lineno), "deepspeed"
            if record is None:
                record, kind = parse_lmspec_line(text, lineno), "lmspec-stdout"
            peak = parse_megatron_memory(text)
            if peak is not None:
                log.peak_memory_bytes = max(peak, log.peak_memory_bytes or 0)
                log.add_format("megatron")
            setting = parse_setting(text)
            if setting is not None:
                log.settings.setdefault(*setting)
        if record is None:
            continue
        log.add_format(kind)
        if record.step in by_step:
            by_step[record.step].merge(record)
        else:
            by_step[record.step] = record
    log.steps = [by_step[step] for step in sorted(by_step)]
    _fill_batch(log)
    return log


def _fill_batch(log: ParsedLog) -> None:
    """DeepSpeed's CurrSamplesPerSec is train_batch_size / step time: recover the step time."""
    for record in log.steps:
        if record.global_batch_size is None:
            record.global_batch_size = log.settings.get("global_batch_size")
        if record.step_time_s is None and record.samples_per_s and record.global_batch_size:
            record.step_time_s = record.global_batch_size / record.samples_per_s


def parse_log(path: Path, regex: str | None = None) -> ParsedLog:
    resolved = resolve_log(path)
    return parse_lines(read_lines(resolved), str(resolved), regex)
