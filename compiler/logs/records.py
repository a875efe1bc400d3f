"""What one logged step holds, whatever wrote it: every field is optional but the step."""

from __future__ import annotations

from dataclasses import dataclass, field, fields


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
    """All steps found in one log, in step order, and which formats were recognised."""

    path: str
    formats: list[str] = field(default_factory=list)
    steps: list[StepRecord] = field(default_factory=list)
    peak_memory_bytes: int | None = None  # from memory reports outside step lines
    settings: dict[str, int] = field(default_factory=dict)  # start-up printout: seq_length, world_size, ...

    def add_format(self, name: str) -> None:
        if name not in self.formats:
            self.formats.append(name)
