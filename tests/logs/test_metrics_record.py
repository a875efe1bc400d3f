"""The one metrics record: what the runtime writes (a metrics.jsonl line, a stdout line) reads back into the same
record, over many records with NaN/inf values and missing fields, and logs in today's format read and are
written again byte for byte."""

from __future__ import annotations

import dataclasses
import json
import math
import random
from pathlib import Path

import pytest

from lmspec.compiler.observe.metrics_record import INT_FIELDS, METRIC_FIELDS, StepMetrics

DATA = Path(__file__).resolve().parents[1] / "data" / "logs"
# What the stdout line prints of each field: the largest difference a read-back value may have.
TEXT_PRECISION = {
    "loss": 0.5e-4,
    "grad_norm": 0.5e-3,
    "tokens_per_s": 0.5,
    "step_time_s": 0.5e-3,
    "mfu": 0.5e-4,
    "peak_memory_bytes": 2**19,
}
TEXT_FIELDS = ("loss", "lr", "grad_norm", "tokens_per_s", "step_time_s", "mfu", "peak_memory_bytes")
RUNTIME_FIELDS = ("step", *TEXT_FIELDS)  # what runtime/train/metrics.py fills
SPECIAL = (math.nan, math.inf, -math.inf)


def _value(rng: random.Random, name: str) -> int | float:
    if name in INT_FIELDS:
        return rng.choice([0, 1, rng.randrange(2**20), rng.randrange(2**50), 10**30])
    if rng.random() < 0.15:
        return rng.choice(SPECIAL)
    magnitude = {"tokens_per_s": (0, 7), "step_time_s": (-3, 4), "mfu": (-4, 0), "lr": (-9, -1)}.get(name, (-3, 3))
    return rng.choice([1.0, -1.0]) * 10 ** rng.uniform(*magnitude) if name == "loss" else 10 ** rng.uniform(*magnitude)


def _records(n: int, fields: tuple[str, ...], seed: int) -> list[StepMetrics]:
    """n records, each with a random subset of `fields` set (all of them for one record in four)."""
    rng = random.Random(seed)
    records = []
    for i in range(n):
        chosen = fields if i % 4 == 0 else rng.sample(fields, rng.randrange(len(fields) + 1))
        records.append(StepMetrics(step=rng.randrange(10**7), **{f: _value(rng, f) for f in chosen}))  # type: ignore[arg-type]
    return records


def _same(a: int | float | None, b: int | float | None) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def test_json_line_reads_back_into_the_same_record() -> None:
    for record in _records(3000, METRIC_FIELDS, seed=1):
        back = StepMetrics.from_json(record.to_json(), line=7)
        assert back is not None and back.line == 7 and back.step == record.step
        assert all(_same(getattr(back, f), getattr(record, f)) for f in METRIC_FIELDS), record
        assert back.to_json() == record.to_json()


def test_text_line_reads_back_to_its_printed_precision() -> None:
    """from_text inverts to_text: the fields set are the fields read, each within what the line prints
    (NaN stays NaN, inf stays inf), and the record read prints the very same line."""
    for record in _records(3000, TEXT_FIELDS, seed=2):
        text = record.to_text()
        back = StepMetrics.from_text(text, line=3)
        assert back is not None and (back.step, back.line) == (record.step, 3), text
        assert back.to_text() == text
        for name in METRIC_FIELDS:
            wrote, read = getattr(record, name), getattr(back, name)
            assert (wrote is None) == (read is None), (name, text)
            if wrote is None or _same(wrote, read):
                continue
            assert math.isfinite(wrote), (name, text)
            limit = abs(wrote) * 0.5e-3 if name == "lr" else TEXT_PRECISION[name]
            assert abs(read - wrote) <= limit * (1 + 1e-9) + abs(wrote) * 1e-15, (name, text)


def test_the_runtimes_lines_are_todays_format() -> None:
    """The bytes runtime/train/metrics.py wrote before the record type was shared."""
    record = StepMetrics(
        step=10,
        loss=4.12345,
        lr=3e-3,
        grad_norm=0.5123,
        tokens_per_s=4020.18,
        step_time_s=0.5094,
        mfu=0.15018,
        peak_memory_bytes=412010000,
    )
    assert record.to_text() == (
        "step     10 | loss 4.1235 | lr 3.000e-03 | grad_norm 0.512 | 4,020 tokens/s | 509 ms/step | "
        "MFU 15.02% | peak mem 393 MiB"
    )
    assert record.to_json() == (
        '{"grad_norm": 0.5123, "loss": 4.12345, "lr": 0.003, "mfu": 0.15018, "peak_memory_bytes": 412010000, '
        '"step": 10, "step_time_s": 0.5094, "tokens_per_s": 4020.18}'
    )
    nan = StepMetrics(step=17, loss=math.nan, lr=1e-3, grad_norm=math.inf, tokens_per_s=1.0, step_time_s=1.0, mfu=0.0)
    assert (
        nan.to_text() == "step     17 | loss nan | lr 1.000e-03 | grad_norm inf | 1 tokens/s | 1000 ms/step | MFU 0.00%"
    )
    assert '"loss": NaN' in nan.to_json() and '"grad_norm": Infinity' in nan.to_json()


def test_old_logs_read_and_print_again_byte_for_byte() -> None:
    stdout = [line for line in (DATA / "lmspec_train_nan.log").read_text().splitlines() if line.startswith("step ")]
    assert len(stdout) == 3
    for line in stdout:
        record = StepMetrics.from_text(line)
        assert record is not None and record.to_text() == line
    for text in (DATA / "healthy_lmspec_metrics.jsonl").read_text().splitlines():
        row = json.loads(text)
        record = StepMetrics.from_json(text)
        assert record is not None
        assert {f: getattr(record, f) for f in RUNTIME_FIELDS} == row
        assert record.to_json() == json.dumps(row, sort_keys=True)


@pytest.mark.parametrize(
    "text",
    [
        "step 5 | loss 1.0 | 1.2.3 tokens/s",  # not a number
        "step 5 | lr 1e-3 | loss 1.0",  # out of order
        "step 5 | loss 1.0 | speed 3",  # not a part of the line
        "step 5 | loss  1.0",  # the line prints one space
        "step 5 | loss ",
        "step x5 | loss 1.0",
        "step ²5 | loss 1.0",  # a digit, but not ASCII
        "step " + "9" * 19 + " | loss 1.0",  # past int64
        " step 5 | loss 1.0",
        "iteration 5 | loss 1.0",
    ],
)
def test_text_lines_the_runtime_does_not_write_are_refused(text: str) -> None:
    assert StepMetrics.from_text(text) is None


@pytest.mark.parametrize(
    ("text", "read"),
    [
        ('{"step": 3, "loss": "1.0", "lr": true, "mfu": 1}', {"mfu": 1.0}),  # strings and bools are no numbers
        ('{"step": 3, "peak_memory_bytes": NaN, "nan_iterations": 2.0}', {"nan_iterations": 2}),  # a count is finite
        ('{"step": 3, "global_batch_size": 1e300}', {"global_batch_size": int(1e300)}),
        ('{"step": 3, "peak_memory_bytes": 1' + "0" * 400 + "}", {"peak_memory_bytes": 10**400}),
        ('{"step": 3, "extra": 1}', {}),
    ],
)
def test_json_values_that_are_not_numbers_are_left_out(text: str, read: dict[str, int | float]) -> None:
    record = StepMetrics.from_json(text)
    assert record is not None and {f: v for f in METRIC_FIELDS if (v := getattr(record, f)) is not None} == read


@pytest.mark.parametrize("text", ['{"step": "5"}', "[1, 2]", "{not json", '{"loss": 1.0}', "[" * 50_000])
def test_json_lines_without_a_step_are_refused(text: str) -> None:
    assert StepMetrics.from_json(text) is None


def test_filled_from_keeps_the_first_value_of_each_field() -> None:
    first = StepMetrics(step=4, line=2, lr=1e-3)
    merged = first.filled_from(StepMetrics(step=4, line=9, lr=2e-3, samples_per_s=8.0))
    assert (merged.line, merged.lr, merged.samples_per_s) == (2, 1e-3, 8.0)


def test_of_builds_what_init_builds() -> None:
    """The readers' constructor (no per-field frozen setattr) gives the same record, still frozen."""
    for record in _records(200, METRIC_FIELDS, seed=3):
        values = {f: getattr(record, f) for f in METRIC_FIELDS if getattr(record, f) is not None}
        built = StepMetrics.of(record.step, 5, values)
        assert built.to_json() == record.to_json() and built.line == 5
        assert repr(built) == repr(dataclasses.replace(record, line=5))
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.loss = 1.0  # type: ignore[misc]
