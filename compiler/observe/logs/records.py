"""What one logged step holds, whatever wrote it: every field is optional but the step."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lmspec.compiler.observe.logs.table import StepTable

MAX_DIGITS = 18  # every number of up to 18 digits fits an int64 (a step column)


def digits_int(text: str) -> int | None:
    """A regex's ``\\d+`` group as an int; None past MAX_DIGITS (no log counts that far, and
    int() of a 5,000-digit run raises)."""
    return int(text) if len(text) <= MAX_DIGITS else None


def finite_int(value: float) -> int | None:
    """int(value) for a finite value; None for NaN/inf (int() of them raises)."""
    return int(value) if math.isfinite(value) else None


@dataclass
class StepRecord:
    """One logged step (or one logging interval, as Megatron averages over it)."""

    step: int
    line: int = 0  # 1-based line number in the log, for evidence
    loss: float | None = None
    lr: float | None = None
    grad_norm: float | None = None
    step_time_s: float | None = None
    tokens_per_s: float | None = None
    samples_per_s: float | None = None
    global_batch_size: int | None = None
    mfu: float | None = None  # as the log states it (lmspec's runtime writes one)
    tflops_per_gpu: float | None = None  # Megatron's own "throughput per GPU (TFLOP/s/GPU)"
    peak_memory_bytes: int | None = None
    loss_scale: float | None = None
    nan_iterations: int | None = None

    def merge(self, other: StepRecord) -> None:
        """Fill this record's empty fields from another record of the same step."""
        for f in fields(self):
            if f.name not in ("step", "line") and getattr(self, f.name) is None:
                setattr(self, f.name, getattr(other, f.name))


# Field names a user regex may capture (plus step_time_ms, converted to seconds).
NUMERIC_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(StepRecord) if f.name not in ("step", "line"))


@dataclass
class ParsedLog:
    """All steps found in one log, in step order, and which formats were recognised.

    The steps live in a StepTable (compact columns); `records()` yields them one at a time,
    each completed from the start-up settings (`fill_batch`). `steps` is the whole list, for
    a log known to be small (tests, excerpts): the reports of `lmspec logs` iterate `records()`.
    """

    path: str
    table: StepTable = field(default_factory=lambda: _new_table())
    formats: list[str] = field(default_factory=list)
    peak_memory_bytes: int | None = None  # from memory reports outside step lines
    settings: dict[str, int] = field(default_factory=dict)  # start-up printout: seq_length, world_size, ...
    notes: list[str] = field(default_factory=list)  # what the reader had to leave out, for the report
    line_count: int = 0

    def add_format(self, name: str) -> None:
        if name not in self.formats:
            self.formats.append(name)

    def records(self) -> Iterator[StepRecord]:
        for record in self.table.records():
            fill_batch(record, self.settings)
            yield record

    @property
    def steps(self) -> list[StepRecord]:
        return list(self.records())


def _new_table() -> StepTable:
    from lmspec.compiler.observe.logs.table import StepTable

    return StepTable()


def fill_batch(record: StepRecord, settings: dict[str, int]) -> None:
    """The batch from the start-up settings when the step does not state it, and DeepSpeed's step
    time: its CurrSamplesPerSec is train_batch_size / step time."""
    if record.global_batch_size is None:
        record.global_batch_size = settings.get("global_batch_size")
    if record.step_time_s is None and record.samples_per_s and record.global_batch_size:
        record.step_time_s = record.global_batch_size / record.samples_per_s
