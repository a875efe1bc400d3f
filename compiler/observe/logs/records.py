"""One log's steps as read (each a StepMetrics, compiler/observe/metrics_record.py) and what else it told."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from lmspec.compiler.observe.metrics_record import StepMetrics

if TYPE_CHECKING:
    from lmspec.compiler.observe.logs.table import StepTable


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

    def records(self) -> Iterator[StepMetrics]:
        settings = self.settings
        for record in self.table.records():
            yield fill_batch(record, settings)

    @property
    def steps(self) -> list[StepMetrics]:
        return list(self.records())


def _new_table() -> StepTable:
    from lmspec.compiler.observe.logs.table import StepTable

    return StepTable()


def fill_batch(record: StepMetrics, settings: dict[str, int]) -> StepMetrics:
    """The record with the batch from the start-up settings when the step does not state it, and DeepSpeed's
    step time: its CurrSamplesPerSec is train_batch_size / step time."""
    batch = record.global_batch_size
    if batch is None and "global_batch_size" in settings:
        batch = settings["global_batch_size"]
        record = dataclasses.replace(record, global_batch_size=batch)
    if record.step_time_s is None and record.samples_per_s and batch:
        record = dataclasses.replace(record, step_time_s=batch / record.samples_per_s)
    return record
