"""train.logging: the metrics records also as TensorBoard scalars (read back with tensorboard's own
EventAccumulator) and as an offline W&B run (runtime/train/metric_sinks.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.build import compile_build

from lmspec.compiler.build.files import TENSORBOARD_DIR
from lmspec.runtime.train.loop import load_build
from lmspec.runtime.train.metrics import MetricsLog

LOSSES = {2: 6.25, 4: 5.5, 6: 4.75}


def _log_steps(overrides: list[str], tmp_path: Path) -> Path:
    build = load_build(compile_build(tmp_path / "build", ["train.log_interval=2", *overrides]).dir)
    run_dir = tmp_path / "run"
    log = MetricsLog(
        build.training(),
        run_dir,
        world_size=2,
        is_rank0=True,
        total_steps=6,
        first_step=0,
        tokens_per_step=build.plan.trained().batch.tokens_per_step,
        flops_per_token=build.plan.trained().flops.per_token,
    )
    for step in range(1, 7):
        log.record(step, LOSSES.get(step, 7.0), 1e-3, 1.0, 0.5)
    log.record_validation(6, 4.5)
    log.close()
    return run_dir


def test_tensorboard_has_the_loss_of_every_logged_step(tmp_path: Path) -> None:
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    run_dir = _log_steps(["train.logging.tensorboard=true"], tmp_path)
    events = event_accumulator.EventAccumulator(str(run_dir / TENSORBOARD_DIR))
    events.Reload()
    assert {e.step: e.value for e in events.Scalars("loss")} == LOSSES
    assert [(e.step, e.value) for e in events.Scalars("val_loss")] == [(6, 4.5)]
    assert {"lr", "grad_norm", "tokens_per_s", "mfu"} <= set(events.Tags()["scalars"])


def test_off_by_default_writes_nothing_but_metrics_jsonl(tmp_path: Path) -> None:
    run_dir = _log_steps([], tmp_path)
    assert sorted(p.name for p in run_dir.iterdir()) == ["metrics.jsonl"]


def test_wandb_is_offline_by_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run_dir = _log_steps(["train.logging.wandb.project=lmspec-test"], tmp_path)
    (offline,) = (run_dir / "wandb").glob("offline-run-*")
    assert list(offline.glob("*.wandb"))  # the run's records, for `wandb sync`; nothing was sent
