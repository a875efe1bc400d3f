"""Find the steps in a log file or run directory, whatever wrote it, reading it block by block.

Only the lines that can hold a step, a memory report or a start-up setting are looked at in
Python: a Scout (compiler/observe/logs/scout.py) finds them by the words each format cannot do without
(its needles below), and each of those lines goes through the same parsers as ever. With
`--regex` every line is matched (a user pattern has no needles).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from lmspec.compiler.build.files import METRICS
from lmspec.compiler.errors import UsageError
from lmspec.compiler.observe.logs.deepspeed import parse_deepspeed_line
from lmspec.compiler.observe.logs.launcher import strip_prefix
from lmspec.compiler.observe.logs.lightning import LightningBars
from lmspec.compiler.observe.logs.megatron import parse_megatron_line, parse_megatron_memory
from lmspec.compiler.observe.logs.nemo import parse_nemo_line
from lmspec.compiler.observe.logs.reader import MAX_LINE_BYTES, Block, LogFile, MemoryLog
from lmspec.compiler.observe.logs.records import ParsedLog
from lmspec.compiler.observe.logs.scout import Needle, Scout
from lmspec.compiler.observe.logs.settings import parse_setting
from lmspec.compiler.observe.logs.stats import DEFAULT_WARMUP_STEPS
from lmspec.compiler.observe.logs.table import StepTable
from lmspec.compiler.observe.logs.torchtitan import parse_torchtitan_line
from lmspec.compiler.observe.logs.user_regex import compile_user_regex, parse_user_line
from lmspec.compiler.observe.metrics_record import StepMetrics

# What a run directory may hold, in the order looked for.
RUN_DIR_LOGS: tuple[str, ...] = (METRICS, "train.log", "stdout.log", "stderr.log")

# A text line yields something only if it holds one of these: Megatron's and NeMo 2's iteration lines
# ("iteration"), Megatron's memory report ("memory (MB)"), lmspec's stdout line (" | loss "), both
# DeepSpeed lines ("step=", the old timer's "SamplesPerSec="), torchtitan's ("step:"), a redraw of
# Lightning's progress bar (tqdm's "%|"), a start-up setting
# (every name in lmspec.compiler.observe.logs.settings ends in "_size", is "seq_length" or ends in
# "_per_gpu", and is followed by a space).
TEXT_NEEDLES = tuple(
    Needle(n)
    for n in (
        b"iteration",
        b"memory (MB)",
        b" | loss ",
        b"step=",
        b"SamplesPerSec=",
        b"step:",
        b"%|",
        b"_size ",
        b"seq_length ",
        b"_per_gpu ",
    )
)
# A metrics.jsonl line is a step only with a "step" key: written plainly, or with \u escapes.
JSONL_NEEDLES = (Needle(b'"step"'), Needle(b"\\"))
_BLANK = np.zeros(256, dtype=bool)
_BLANK[list(b" \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f")] = True  # bytes str.strip() removes


def resolve_log(path: Path) -> Path:
    """A log file itself, or the first known log inside a run directory."""
    if path.is_dir():
        for name in RUN_DIR_LOGS:
            if (path / name).is_file():
                return path / name
        raise UsageError(f"{path} holds none of {', '.join(RUN_DIR_LOGS)}; pass the log file itself")
    if not path.exists() and not path.is_symlink():
        raise UsageError(f"{path}: no such log file or run directory")
    return path  # LogFile refuses what is not a regular file (a FIFO, a device) before reading


class LogParser:
    """Steps, formats, start-up settings and memory reports of one log, fed block by block."""

    def __init__(self, source: str, regex: str | None = None, warmup_steps: int = DEFAULT_WARMUP_STEPS) -> None:
        self.log = ParsedLog(path=source, table=StepTable(count_above=warmup_steps))
        self.user = compile_user_regex(regex) if regex else None
        # None until the first line that is not blank says whether this is a metrics.jsonl
        self.kind: str | None = "regex" if self.user is not None else None
        self._scout: Scout | None = None
        self._bars = LightningBars()  # a bar's redraws of one count make one record: held until the next count

    def feed(self, block: Block) -> None:
        if self.kind is None:
            self._decide(block)  # the lines before the first that is not blank hold nothing
            if self.kind is None:
                return
        if self.kind == "regex":
            for i, line in enumerate(block.lines()):
                self._regex_line(block.first_line + i, strip_prefix(line))
            return
        assert self._scout is not None
        read = StepMetrics.from_json if self.kind == "lmspec-jsonl" else None
        for i in self._scout.lines(block).tolist():
            text = strip_prefix(block.line(i))
            if read is not None:
                self._add(read(text, block.first_line + i), "lmspec-jsonl")
            else:
                self._text_line(block.first_line + i, text)

    def _decide(self, block: Block) -> None:
        """The log's kind, from the first line that is not blank (if the block has one)."""
        text_at = np.flatnonzero(~_BLANK[np.frombuffer(block.data, dtype=np.uint8)])
        for i in np.unique(np.searchsorted(block.ends, text_at, side="right")).tolist():
            if i >= len(block):
                break
            line = strip_prefix(block.line(i))
            if line.strip():
                jsonl = line.lstrip().startswith("{")
                self.kind = "lmspec-jsonl" if jsonl else "text"
                self._scout = Scout(JSONL_NEEDLES if jsonl else TEXT_NEEDLES)
                return

    def _regex_line(self, lineno: int, text: str) -> None:
        assert self.user is not None
        self._add(parse_user_line(self.user, text, lineno, self.log.table.distinct + 1), "regex")

    def _text_line(self, lineno: int, text: str) -> None:
        record, kind = parse_nemo_line(text, lineno), "nemo"
        if record is None:
            record, kind = parse_megatron_line(text, lineno), "megatron"
        if record is None:
            record, kind = parse_deepspeed_line(text, lineno), "deepspeed"
        if record is None:
            record, kind = parse_torchtitan_line(text, lineno), "torchtitan"
        if record is None:
            record, kind = StepMetrics.from_text(text, lineno), "lmspec-stdout"
        if record is None:
            record, kind = self._bars.feed(text, lineno), "lightning"
        peak = parse_megatron_memory(text)
        if peak is not None:
            self.log.peak_memory_bytes = max(peak, self.log.peak_memory_bytes or 0)
            self.log.add_format("megatron")
        setting = parse_setting(text)
        if setting is not None:
            self.log.settings.setdefault(*setting)
        self._add(record, kind)

    def _add(self, record: StepMetrics | None, kind: str) -> None:
        if record is not None:
            self.log.add_format(kind)
            self.log.table.add(record)

    def finish(self, source: LogFile) -> ParsedLog:
        self._add(self._bars.flush(), "lightning")
        self.log.line_count = source.line_count
        if source.long_lines:
            self.log.notes.append(
                f"{source.path}: {source.long_lines} line(s) longer than {MAX_LINE_BYTES // 1024} KiB: "
                f"only the first {MAX_LINE_BYTES // 1024} KiB of each were read"
            )
        if note := self.log.table.sampled_note():
            self.log.notes.append(note)
        return self.log


def parse_source(
    source: LogFile, name: str, regex: str | None = None, warmup_steps: int = DEFAULT_WARMUP_STEPS
) -> ParsedLog:
    parser = LogParser(name, regex, warmup_steps)
    for block in source.blocks():
        parser.feed(block)
    return parser.finish(source)


def parse_lines(lines: list[str], source: str, regex: str | None = None) -> ParsedLog:
    """The steps of lines already in memory (each without its line break)."""
    return parse_source(MemoryLog(lines, source), source, regex)


def parse_log(path: Path, regex: str | None = None, warmup_steps: int = DEFAULT_WARMUP_STEPS) -> ParsedLog:
    resolved = resolve_log(path)
    return parse_source(LogFile(resolved), str(resolved), regex, warmup_steps)
