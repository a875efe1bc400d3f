"""megatron-core on 2 CPU ranks: TP=2 with sequence parallel, PP=2 with an uneven layout,
MoE with EP=2 (tiny_moe: MLA, group-limited top-4, shared expert, first layer dense), and a TP=2
checkpoint resumed at TP=1."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
from helpers.build import compile_build
from helpers.torchrun import run

pytestmark = pytest.mark.slow

FIELDS = {"step", "loss", "lr", "grad_norm", "tokens_per_s", "step_time_s", "mfu", "peak_memory_bytes"}
LOG_EVERY_STEP = ["train.log_interval=1"]


@pytest.fixture(scope="module")
def tp2_run(tmp_path_factory: pytest.TempPathFactory):
    """The default tiny job (30 steps, checkpoint every 10, keep 2) at TP=2 + SP."""
    root = tmp_path_factory.mktemp("tp2")
    build = compile_build(
        root / "build", ["name=tp2", "parallel.tp=2", "parallel.sequence_parallel=true", *LOG_EVERY_STEP]
    ).dir
    return run(build, root)


def test_tp2_trains_loss_decreases_and_checkpoints(tp2_run) -> None:
    assert tp2_run.code == 0, tp2_run.output[-4000:]
    metrics = [m for m in tp2_run.metrics("tp2") if "loss" in m]
    assert [m["step"] for m in metrics] == list(range(1, 31))
    val = tp2_run.val_losses("tp2")  # hardware=cpu validates every 10 steps, here with TP=2
    assert sorted(val) == [10, 20, 30] and val[30] < val[10]
    assert all(FIELDS <= m.keys() and math.isfinite(m["loss"]) for m in metrics)
    first, last = metrics[0]["loss"], metrics[-1]["loss"]
    assert first > 5.5 and last < first - 2.0, (first, last)  # byte-level text: from ~ln(512) down
    assert metrics[-1]["tokens_per_s"] > 0 and metrics[-1]["mfu"] > 0 and metrics[-1]["peak_memory_bytes"] > 0
    ckpt = tp2_run.cwd / "runs" / "tp2" / "checkpoints"
    assert sorted(p.name for p in ckpt.iterdir()) == ["latest", "step_20", "step_30"]  # keep_last_k=2
    assert (ckpt / "latest").read_text().strip() == "step_30"
    manifest = json.loads((ckpt / "step_30" / "manifest.json").read_text())
    assert any(f.startswith("torch_dist/") for f in manifest["files"])
    assert {"trainer_state/rank_0.pt", "trainer_state/rank_1.pt"} <= manifest["files"].keys()
    assert "step     30 | loss" in tp2_run.output


def test_tp2_checkpoint_resumes_at_tp1(tp2_run, tmp_path: Path) -> None:
    assert tp2_run.code == 0
    ckpt = tmp_path / "runs" / "tp2" / "checkpoints"
    shutil.copytree(tp2_run.cwd / "runs" / "tp2" / "checkpoints", ckpt)
    shutil.rmtree(ckpt / "step_30")
    (ckpt / "latest").write_text("step_20\n")
    build = compile_build(
        tmp_path / "build", ["name=tp1", "train.checkpoint.dir=runs/tp2/checkpoints", *LOG_EVERY_STEP]
    ).dir
    resumed = run(build, tmp_path)
    assert resumed.code == 0, resumed.output[-4000:]
    assert "resumed from runs/tp2/checkpoints/step_20 (step 20)" in resumed.output
    tp2, tp1 = tp2_run.losses("tp2"), resumed.losses("tp1")
    assert sorted(tp1) == list(range(21, 31))
    for step in tp1:  # same weights and optimizer state, resharded: equal up to fp32 reduction order
        assert tp1[step] == pytest.approx(tp2[step], abs=1e-4), step


def test_pp2_uneven_layout_1f1b(tmp_path: Path) -> None:
    build = compile_build(
        tmp_path / "build",
        ["name=pp2", "parallel.pp=2", "parallel.pp_layout=[1,3]", "train.steps=4", "train.checkpoint.interval=4"]
        + LOG_EVERY_STEP,
    ).dir
    result = run(build, tmp_path)
    assert result.code == 0, result.output[-4000:]
    assert "pipeline stage 0/2: 1 layers" in result.output
    assert "pipeline stage 1/2: 3 layers" in result.output
    losses = result.losses("pp2")
    assert sorted(losses) == list(range(1, 5)) and losses[4] < losses[1]


def test_moe_ep2(tmp_path: Path) -> None:
    build = compile_build(
        tmp_path / "build",
        [
            "name=moe",
            "model=tiny_moe",
            "parallel.ep=2",
            "train.steps=4",
            "train.checkpoint.interval=4",
            *LOG_EVERY_STEP,
        ],
    ).dir
    result = run(build, tmp_path)
    assert result.code == 0, result.output[-4000:]
    losses = result.losses("moe")
    assert sorted(losses) == list(range(1, 5)) and losses[4] < losses[1]
    assert (tmp_path / "runs" / "moe" / "checkpoints" / "step_4" / "manifest.json").is_file()
