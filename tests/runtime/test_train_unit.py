"""The entry point's pieces that need no ranks: usage errors, the NaN stop, metrics lines (LR: test_lr_schedule.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from helpers.build import compile_build

from lmspec.compiler.models.flops import mfu
from lmspec.compiler.observe.metrics_record import StepMetrics
from lmspec.runtime.train.loop import load_build, main
from lmspec.runtime.train.metrics import MetricsLog, NonFiniteLoss

RUNTIME_FIELDS = ("step", "loss", "lr", "grad_norm", "tokens_per_s", "step_time_s", "mfu", "peak_memory_bytes")


@pytest.fixture(scope="module")
def tiny_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return compile_build(tmp_path_factory.mktemp("b") / "build", ["train.log_interval=2"]).dir


@pytest.mark.usefixtures("runtime_logging")
def test_missing_build_dir_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path / "nope")]) == 2
    assert "nope is not a build directory (no such directory); compile one" in capsys.readouterr().err
    assert main([]) == 2


@pytest.mark.usefixtures("runtime_logging")
def test_world_size_mismatch_names_the_keys(
    tiny_build: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert main([str(tiny_build)]) == 2
    err = capsys.readouterr().err
    assert "layout.world_size=2" in err and "hardware.gpus_per_node=2" in err and "launch/torchrun.sh" in err


def _metrics_log(build: Path, run_dir: Path) -> MetricsLog:
    opened = load_build(build)
    return MetricsLog(
        opened.spec,
        run_dir,
        world_size=2,
        is_rank0=True,
        total_steps=30,
        first_step=0,
        tokens_per_step=opened.plan.trained().batch.tokens_per_step,
        flops_per_token=opened.plan.trained().flops.per_token,
    )


def test_nan_loss_stops_naming_step_and_keys(tiny_build: Path, tmp_path: Path) -> None:
    log = _metrics_log(tiny_build, tmp_path / "run")
    log.record(1, 6.2, 1e-3, 1.0, 0.5)
    with pytest.raises(NonFiniteLoss) as info:
        log.record(2, math.nan, 1e-3, 1.0, 0.5)
    message = str(info.value)
    assert "at step 2" in message
    assert all(k in message for k in ("train.precision=bf16", "train.grad_clip", "train.optimizer.lr"))


def test_metrics_line_every_log_interval(tiny_build: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Every log_interval steps one record, written twice: its JSON line and its stdout line, from the Plan's
    tokens per step and FLOPs per token."""
    plan = load_build(tiny_build).plan
    log = _metrics_log(tiny_build, tmp_path / "run")
    for step in range(1, 5):
        log.record(step, 5.0 - step, 1e-3, 0.9, 0.25)
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    assert [r["step"] for r in rows] == [2, 4]
    assert all(list(r) == sorted(RUNTIME_FIELDS) for r in rows)  # keys sorted, as metrics.jsonl always had them
    assert rows[0]["tokens_per_s"] == plan.trained().batch.tokens_per_step / 0.25
    flops = plan.trained().flops
    assert rows[0]["mfu"] == mfu(rows[0]["tokens_per_s"], flops.per_token, 2, flops.peak_tflops_per_gpu)
    assert rows[0]["peak_memory_bytes"] > 0
    printed = capsys.readouterr().out.splitlines()
    assert printed == [StepMetrics.from_json(line).to_text() for line in lines]  # type: ignore[union-attr]
    assert printed[1].startswith("step      4 | loss 1.0000 | lr 1.000e-03 | grad_norm 0.900 | 8,192 tokens/s | ")
