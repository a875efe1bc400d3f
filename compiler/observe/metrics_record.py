"""What one logged training step measured: the one record type lmspec's runtime writes and every log reader returns.

The runtime (runtime/train/metrics.py) fills the first eight fields and writes each logged step twice, from
this record: a JSON line of `metrics.jsonl` (`to_json`) and a human line on stdout (`to_text`). `lmspec logs`
and `lmspec doctor` read both back with the record's own inverses (`from_json`, `from_text`), and the other
log readers (Megatron, DeepSpeed, a user regex) return the same record with the fields their format states,
so the writer and the readers cannot drift apart.
A validation is a record of its own in metrics.jsonl: the step and `val_loss` alone.
No torch here: the compiler side imports it too.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

MIB_BYTES = 1 << 20
MAX_DIGITS = 18  # every number of up to 18 digits fits an int64 (a step column)


@dataclass(frozen=True, kw_only=True)
class StepMetrics:
    """One logged step (or one logging interval, as Megatron averages over it); every field but the step is
    optional, as no format states them all."""

    step: int
    line: int = 0  # where a log reader found it (1-based line of the log, for evidence); 0: not read from a log
    loss: float | None = None
    lr: float | None = None
    grad_norm: float | None = None
    step_time_s: float | None = None
    tokens_per_s: float | None = None
    samples_per_s: float | None = None
    global_batch_size: int | None = None
    mfu: float | None = None  # fraction of the GPUs' bf16 peak, model FLOPs (lmspec's runtime writes one)
    tflops_per_gpu: float | None = None  # Megatron's own "throughput per GPU (TFLOP/s/GPU)"
    tokens_per_s_per_gpu: float | None = None  # torchtitan's own "tps" (tokens per second per device)
    peak_memory_bytes: int | None = None
    loss_scale: float | None = None
    nan_iterations: int | None = None
    val_loss: float | None = None  # lmspec's runtime: the validation loss after this step (a record of its own)

    @classmethod
    def of(cls, step: int, line: int, values: Mapping[str, int | float | None]) -> StepMetrics:
        """The record of a step with `values` (names from METRIC_FIELDS) set, as the log readers build one per step:
        the record __init__ makes, without the frozen __init__'s object.__setattr__ per field (~3 us a record, two
        records a step: a tenth of what `lmspec logs` spends per step of bench/logs_stream.py's log)."""
        record = object.__new__(cls)
        state = record.__dict__
        state.update(_UNSET)
        state.update(values)
        state["step"], state["line"] = step, line
        return record

    def filled_from(self, other: StepMetrics) -> StepMetrics:
        """This record with its empty fields taken from another record of the same step."""
        missing = {name: getattr(other, name) for name in METRIC_FIELDS if getattr(self, name) is None}
        return dataclasses.replace(self, **{k: v for k, v in missing.items() if v is not None})

    def to_json(self) -> str:
        """The metrics.jsonl line (no line break): the fields set, keys sorted (NaN/Infinity as json writes them)."""
        return json.dumps(
            {name: getattr(self, name) for name in _JSON_FIELDS if getattr(self, name) is not None}, sort_keys=True
        )

    @classmethod
    def from_json(cls, text: str, line: int = 0) -> StepMetrics | None:
        """The record of a metrics.jsonl line; None for a line that is not a JSON object with an int "step".
        Keys that are not fields and values that are not numbers are left out, as is a count (an int field)
        that is not finite."""
        try:
            obj = json.loads(text)  # json reads NaN / Infinity, which a diverged run writes
        except (ValueError, RecursionError):  # not JSON, or nested deeper than json's recursion limit
            return None
        if not isinstance(obj, dict) or not isinstance(obj.get("step"), int):
            return None
        values: dict[str, int | float] = {}
        for name in METRIC_FIELDS:
            value = obj.get(name)
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                continue
            if name not in INT_FIELDS:
                values[name] = float(value)
            elif isinstance(value, int) or (value := finite_int(value)) is not None:
                values[name] = value
        return cls.of(obj["step"], line, values)

    def to_text(self) -> str:
        """The human line on stdout, e.g. ``step     10 | loss 4.1234 | lr 3.000e-03 | grad_norm 0.512 |
        4,020 tokens/s | 509 ms/step | MFU 15.02% | peak mem 393 MiB``; a field not set has no part."""
        parts = [f"step {self.step:>6}"]
        for part in _TEXT_PARTS:
            value = getattr(self, part.field)
            if value is not None:
                parts.append(f"{part.prefix}{part.show(value)}{part.suffix}")
        return " | ".join(parts)

    @classmethod
    def from_text(cls, text: str, line: int = 0) -> StepMetrics | None:
        """The record of a `to_text` line (the inverse, to the precision the line prints); None for any other line."""
        if not text.startswith("step "):
            return None
        match = _TEXT_LINE.fullmatch(text.rstrip())
        if match is None:
            return None
        step = digits_int(match.group(1))
        if step is None:
            return None
        values: dict[str, int | float | None] = {}
        for part, shown in zip(_TEXT_PARTS, match.groups()[1:], strict=True):
            if shown is not None:
                try:  # what float() refuses ("1.2.3") is no number the line prints
                    values[part.field] = part.read(shown)
                except (ValueError, OverflowError):
                    return None
        return cls.of(step, line, values)


@dataclass(frozen=True)
class _TextPart:
    """One ``prefix value suffix`` part of the stdout line; `read` inverts `show`."""

    field: str
    prefix: str
    suffix: str
    show: Callable[[float], str]
    read: Callable[[str], float | int | None]

    def pattern(self) -> str:
        """The part as `from_text` matches it, optional: its value is what `show` prints, no space in it."""
        return rf"(?: \| {re.escape(self.prefix)}(\S+){re.escape(self.suffix)})?"


def _grouped(text: str) -> float:
    """A number printed with thousands separators ("4,020")."""
    return float(text.replace(",", ""))


_TEXT_PARTS: tuple[_TextPart, ...] = (
    _TextPart("loss", "loss ", "", lambda v: f"{v:.4f}", float),
    _TextPart("lr", "lr ", "", lambda v: f"{v:.3e}", float),
    _TextPart("grad_norm", "grad_norm ", "", lambda v: f"{v:.3f}", float),
    _TextPart("tokens_per_s", "", " tokens/s", lambda v: f"{v:,.0f}", _grouped),
    _TextPart("step_time_s", "", " ms/step", lambda v: f"{v * 1000:.0f}", lambda t: float(t) / 1000),
    _TextPart("mfu", "MFU ", "%", lambda v: f"{v * 100:.2f}", lambda t: float(t) / 100),
    _TextPart(
        "peak_memory_bytes",
        "peak mem ",
        " MiB",
        lambda v: f"{v / MIB_BYTES:,.0f}",
        lambda t: finite_int(_grouped(t) * MIB_BYTES),
    ),
)

# what to_text writes, each part optional but in order (the step padded to 6 characters)
_TEXT_LINE = re.compile(r"step +([0-9]+)" + "".join(part.pattern() for part in _TEXT_PARTS))

# The fields a log may state, apart from the step and where it was found: also the names a `--regex` may capture.
METRIC_FIELDS: tuple[str, ...] = tuple(
    f.name for f in dataclasses.fields(StepMetrics) if f.name not in ("step", "line")
)
INT_FIELDS = frozenset(f.name for f in dataclasses.fields(StepMetrics) if f.type == "int | None")
_UNSET = {name: None for name in METRIC_FIELDS}
_JSON_FIELDS = tuple(f.name for f in dataclasses.fields(StepMetrics) if f.name != "line")


def digits_int(text: str) -> int | None:
    """A run of digits (a regex's ``\\d+`` group) as an int; None past MAX_DIGITS (no log counts that far,
    and int() of a 5,000-digit run raises)."""
    return int(text) if len(text) <= MAX_DIGITS else None


def field_value(name: str, number: float) -> int | float | None:
    """A number a log shows, as record field `name` holds it: a count (INT_FIELDS) an int, None when it is not
    finite (a count is never NaN: such a field is not read); any other field as it is."""
    return finite_int(number) if name in INT_FIELDS else number


def finite_int(value: float) -> int | None:
    """int(value) for a finite value; None for NaN/inf (int() of them raises)."""
    return int(value) if math.isfinite(value) else None
