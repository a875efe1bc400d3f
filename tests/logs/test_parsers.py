"""Each parser against the corpus in tests/data/logs (formats cited in each file's header)."""

from __future__ import annotations

import json
import math
import random
import re
from pathlib import Path

import numpy as np
import pytest
from helpers.paths import LOG_DATA

from lmspec.compiler.errors import UsageError
from lmspec.compiler.observe.logs.launcher import strip_prefix
from lmspec.compiler.observe.logs.parse import parse_lines, parse_log
from lmspec.compiler.observe.logs.stats import percentile, steady_steps, summarize
from lmspec.compiler.observe.logs.user_regex import compile_user_regex

_MIB = 1024 * 1024


def test_megatron_iteration_fields_and_memory() -> None:
    log = parse_log(LOG_DATA / "healthy_megatron.log")
    lines = (LOG_DATA / "healthy_megatron.log").read_text().splitlines()
    iteration_lines = [line for line in lines if " iteration " in line]
    assert log.formats == ["megatron"]
    assert [s.step for s in log.steps] == list(range(1, len(iteration_lines) + 1))
    first = log.steps[0]
    fields = dict(part.strip().rsplit(": ", 1) for part in iteration_lines[0].split("|")[1:-1])
    assert first.step_time_s == pytest.approx(float(fields["elapsed time per iteration (ms)"]) / 1000)
    assert first.loss == float(fields["lm loss"]) and first.lr == float(fields["learning rate"])
    assert first.global_batch_size == int(fields["global batch size"])
    assert first.grad_norm == float(fields["grad norm"])
    assert first.tflops_per_gpu == float(fields["throughput per GPU (TFLOP/s/GPU)"])
    assert first.line == lines.index(iteration_lines[0]) + 1
    max_allocated = float(re.search(r"max allocated: ([\d.]+)", "\n".join(lines)).group(1))
    assert log.peak_memory_bytes == int(max_allocated * _MIB)


def test_megatron_nan_iterations_counted() -> None:
    log = parse_log(LOG_DATA / "megatron_nan.log")
    assert log.steps[-1].nan_iterations == 3 and log.steps[-1].loss is None  # Megatron omits a NaN loss
    assert all(s.nan_iterations == 0 for s in log.steps[:-1])


def test_deepspeed_step_time_from_samples_per_second() -> None:
    log = parse_log(LOG_DATA / "healthy_deepspeed.log")
    text = (LOG_DATA / "healthy_deepspeed.log").read_text()
    batch = int(re.search(r"train_batch_size \.+ (\d+)", text).group(1))
    current = [float(v) for v in re.findall(r"CurrSamplesPerSec=([\d.]+)", text)]
    lrs = [float(v) for v in re.findall(r"lr=\[([\d.e-]+)\]", text)]
    assert log.formats == ["deepspeed"]
    assert [s.samples_per_s for s in log.steps] == current
    assert [s.lr for s in log.steps] == lrs
    assert [s.step_time_s for s in log.steps] == pytest.approx([batch / c for c in current])
    max_gb = float(re.findall(r"MaxMemAllocated=([\d.]+)GB", text)[-1])
    assert log.steps[-1].peak_memory_bytes == int(max_gb * 1024**3)


def test_lmspec_jsonl_reads_every_key_and_nan() -> None:
    rows = [json.loads(line) for line in (LOG_DATA / "lmspec_metrics_nan.jsonl").read_text().splitlines()]
    log = parse_log(LOG_DATA / "lmspec_metrics_nan.jsonl")
    assert log.formats == ["lmspec-jsonl"]
    for row, record in zip(rows, log.steps, strict=True):
        for key in ("step", "lr", "tokens_per_s", "step_time_s", "mfu", "peak_memory_bytes"):
            assert getattr(record, key) == row[key]
    assert math.isnan(log.steps[-1].loss) and math.isinf(log.steps[-1].grad_norm)


def test_run_directory_finds_metrics_jsonl(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text((LOG_DATA / "healthy_lmspec_metrics.jsonl").read_text())
    assert len(parse_log(tmp_path).steps) == len((LOG_DATA / "healthy_lmspec_metrics.jsonl").read_text().splitlines())
    with pytest.raises(UsageError, match="no such log file"):
        parse_log(tmp_path / "nothing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match="holds none of"):
        parse_log(tmp_path / "empty")


@pytest.mark.parametrize(
    ("line", "stripped"),
    [
        ("[rank3]:[E1122 03:24:08.117 ProcessGroupNCCL.cpp:632] x", "[E1122 03:24:08.117 ProcessGroupNCCL.cpp:632] x"),
        ("[default0]: iteration 5/ 10 |", "iteration 5/ 10 |"),
        ("3: [rank11]: Traceback (most recent call last):", "Traceback (most recent call last):"),
        (" 12: step=5, skipped=0", "step=5, skipped=0"),
        ("gpu-node-003:48211:48211 [0] NCCL INFO x", "gpu-node-003:48211:48211 [0] NCCL INFO x"),
    ],
)
def test_launcher_prefixes(line: str, stripped: str) -> None:
    assert strip_prefix(line) == stripped


def test_prefixed_megatron_lines_parse_like_plain_ones() -> None:
    plain = (LOG_DATA / "healthy_megatron.log").read_text().splitlines()
    labelled = [f"{i % 3}: [default{i % 8}]:{line}" for i, line in enumerate(plain)]
    assert parse_lines([strip_prefix(line) for line in labelled], "x").steps == parse_lines(plain, "x").steps


def test_user_regex_with_and_without_step_group() -> None:
    lines = (LOG_DATA / "custom_trainer.log").read_text().splitlines()
    with_step = parse_lines(lines, "x", r"step (?P<step>\d+) \| loss (?P<loss>\S+) \| (?P<step_time_ms>[\d.]+) ms")
    without = parse_lines(lines, "x", r"loss (?P<loss>\S+) \| (?P<step_time_ms>[\d.]+) ms")
    losses = [float(v) for v in re.findall(r"loss (\S+)", "\n".join(lines))]
    assert [s.loss for s in with_step.steps] == losses == [s.loss for s in without.steps]
    assert [s.step for s in without.steps] == list(range(1, len(losses) + 1))
    assert with_step.steps[0].step_time_s == pytest.approx(float(re.search(r"([\d.]+) ms", lines[1]).group(1)) / 1000)


@pytest.mark.parametrize("pattern", [r"loss (?P<los>\S+)", r"loss \S+", r"loss (?P<loss>\S+"])
def test_user_regex_mistakes_are_usage_errors(pattern: str) -> None:
    with pytest.raises(UsageError, match="--regex"):
        compile_user_regex(pattern)


def test_percentiles_match_numpy() -> None:
    rng = random.Random(11)
    for n in (1, 2, 7, 100):
        values = sorted(rng.uniform(0, 10) for _ in range(n))
        for q in (0, 50, 90, 100):
            assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))
    summary = summarize([3.0, float("nan"), 1.0, 2.0])
    assert summary is not None and (summary.count, summary.mean, summary.p50) == (3, 2.0, 2.0)


def test_warmup_skip_falls_back_to_all_steps() -> None:
    steps = parse_log(LOG_DATA / "healthy_lmspec_metrics.jsonl").steps
    kept, applied = steady_steps(steps, 10)
    assert applied and [s.step for s in kept] == [s.step for s in steps if s.step > 10]
    kept, applied = steady_steps(steps, 1000)
    assert not applied and kept == steps


def test_lmspec_stdout_line() -> None:
    """runtime/train/metrics.py's human line carries the same numbers as its JSON line."""
    log = parse_log(LOG_DATA / "lmspec_train_nan.log")
    text = (LOG_DATA / "lmspec_train_nan.log").read_text()
    assert log.formats == ["lmspec-stdout"]
    assert [s.loss for s in log.steps] == [float(v) for v in re.findall(r"\| loss (\S+)", text)]
    tokens = [float(v.replace(",", "")) for v in re.findall(r"([\d,]+) tokens/s", text)]
    assert [s.tokens_per_s for s in log.steps] == tokens
    assert [s.mfu for s in log.steps] == pytest.approx([float(v) / 100 for v in re.findall(r"MFU ([\d.]+)%", text)])
    assert log.steps[0].step_time_s == pytest.approx(2.9)


def test_start_up_settings_of_megatron_and_deepspeed() -> None:
    megatron = parse_log(LOG_DATA / "healthy_megatron.log").settings
    assert megatron == {
        "global_batch_size": 1024,
        "micro_batch_size": 1,
        "pp": 1,
        "seq_length": 4096,
        "tp": 1,
        "world_size": 64,
    }
    deepspeed = parse_log(LOG_DATA / "healthy_deepspeed.log").settings
    assert deepspeed == {"global_batch_size": 64, "micro_batch_size": 2}


CORPUS = LOG_DATA / "corpus"  # real excerpts (tests/data/logs/corpus/README.md)


def test_torchtitan_step_lines_of_a_real_log() -> None:
    path = CORPUS / "healthy-torchtitan-step-lines.log"
    log = parse_log(path)
    step_lines = [line for line in path.read_text().splitlines() if " - step: " in line]
    assert log.formats == ["torchtitan"] and len(log.steps) == len(step_lines)
    first = log.steps[0]
    fields = dict(re.findall(r"(\w+):\s+(\S+)", step_lines[0].split(" - INFO - ", 1)[1]))
    assert first.step == int(fields["step"]) and first.loss == float(fields["loss"])
    assert first.tokens_per_s_per_gpu == float(fields["tps"].replace(",", ""))
    assert first.tflops_per_gpu == float(fields["tflops"])
    assert first.mfu == pytest.approx(float(fields["mfu"].rstrip("%")) / 100)
    assert first.peak_memory_bytes == int(float(fields["memory"].split("GiB")[0]) * 1024**3)


def test_torchtitan_colours_are_not_read_as_values() -> None:
    line = "\x1b[31mstep:  5  \x1b[32mloss:  4.4394  \x1b[33mmemory:  1.50GiB(2.00%)  \x1b[34mtps: 12,345  \x1b[39m"
    (step,) = parse_lines([line], "t").steps
    assert (step.step, step.loss, step.tokens_per_s_per_gpu) == (5, 4.4394, 12345.0)


def test_megatron_deepspeed_tflops_and_samples_per_second() -> None:
    path = CORPUS / "nan-megatron-deepspeed-grad-norm-nan.log"
    first_line = path.read_text().splitlines()[0]
    fields = dict(part.strip().rsplit(": ", 1) for part in first_line.split("|")[1:-1])
    first = parse_log(path).steps[0]
    assert first.tflops_per_gpu == float(fields["TFLOPs"])
    assert first.samples_per_s == float(fields["samples per second"])


def test_old_deepspeed_timer_line() -> None:
    line = "[2021-06-08 12:02:45,002] [INFO] [timer.py:157:stop] 0/10, SamplesPerSec=1.8825260836384787"
    (step,) = parse_lines([line], "t").steps
    assert (step.step, step.samples_per_s) == (10, 1.8825260836384787)


@pytest.mark.parametrize(
    "pattern",
    [r"tps (?P<tokens_per_s>[\d,]+) mfu (?P<mfu>[\d.]+)%", r"tps (?P<tokens_per_s>\S+) mfu (?P<mfu>\S+)"],
    ids=["percent-after-group", "percent-in-group"],
)
def test_user_regex_thousands_separators_and_percent_mfu(pattern: str) -> None:
    lines = ["step 1 tps 5,856 mfu 34.29%", "step 2 tps 12,001 mfu 35.00%"]
    steps = parse_lines(lines, "t", regex=pattern).steps
    assert [(s.tokens_per_s, s.mfu) for s in steps] == [(5856.0, pytest.approx(0.3429)), (12001.0, 0.35)]


def test_gpt_neox_fields_before_the_iteration_and_flops_with_a_unit() -> None:
    log = parse_log(LOG_DATA / "healthy_gpt_neox.log")
    assert log.formats == ["megatron"]
    assert [(s.step, s.samples_per_s, s.loss) for s in log.steps][0] == (10, 51.234, 7.123456)
    assert [s.tflops_per_gpu for s in log.steps] == [150.3, 152.2, pytest.approx(1100.0)]
