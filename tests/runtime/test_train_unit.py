"""The entry point's pieces that need no ranks: usage errors, LR schedule, the NaN stop, metrics lines."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from lmspec.compiler.build.writer import build_files, write_build
from lmspec.compiler.pipeline import make_plan
from lmspec.runtime.train.loop import load_build, lr_at, main
from lmspec.runtime.train.metrics import MetricsLog, NonFiniteLoss


@pytest.fixture(scope="module")
def tiny_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("b") / "build" / "tiny"
    write_build(target, build_files(make_plan(["train.log_interval=2"])))
    return target


def test_missing_build_dir_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path / "nope")]) == 2
    assert "nope is not a build directory (no such directory); compile one" in capsys.readouterr().err
    assert main([]) == 2


def test_world_size_mismatch_names_the_keys(
    tiny_build: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert main([str(tiny_build)]) == 2
    err = capsys.readouterr().err
    assert "layout.world_size=2" in err and "hardware.gpus_per_node=2" in err and "launch/torchrun.sh" in err


def test_lr_schedule_warmup_then_cosine_to_min(tiny_build: Path) -> None:
    spec = load_build(tiny_build).spec
    opt, warmup, steps = spec.train.optimizer, spec.train.lr_schedule.warmup_steps, spec.train.steps
    assert lr_at(spec, 1) == pytest.approx(opt.lr / warmup)
    assert lr_at(spec, warmup) == pytest.approx(opt.lr)
    assert lr_at(spec, steps) == pytest.approx(opt.min_lr)
    mid = lr_at(spec, (warmup + steps) // 2)
    assert opt.min_lr < mid < opt.lr


def test_nan_loss_stops_naming_step_and_keys(tiny_build: Path, tmp_path: Path) -> None:
    spec = load_build(tiny_build).spec
    log = MetricsLog(spec, tmp_path / "run", world_size=2, is_rank0=True, total_steps=30, first_step=0)
    log.record(1, 6.2, 1e-3, 1.0, 0.5)
    with pytest.raises(NonFiniteLoss) as info:
        log.record(2, math.nan, 1e-3, 1.0, 0.5)
    message = str(info.value)
    assert "at step 2" in message
    assert all(k in message for k in ("train.precision=bf16", "train.grad_clip", "train.optimizer.lr"))


def test_metrics_line_every_log_interval(tiny_build: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = load_build(tiny_build).spec
    log = MetricsLog(spec, tmp_path / "run", world_size=2, is_rank0=True, total_steps=30, first_step=0)
    for step in range(1, 5):
        log.record(step, 5.0 - step, 1e-3, 0.9, 0.25)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [2, 4]
    assert rows[0]["tokens_per_s"] == pytest.approx(16 * 128 / 0.25)
    assert 0 < rows[0]["mfu"] < 1 and rows[0]["peak_memory_bytes"] > 0
    assert "step      4 | loss 1.0000" in capsys.readouterr().out
