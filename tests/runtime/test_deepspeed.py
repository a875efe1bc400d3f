"""DeepSpeed ZeRO-3 on 2 CPU ranks with the build's emitted ds_config.json, on the same megatron-core
datasets as the megatron backend (an HF tokenizer, a 0.7/0.3 blend) with validation; its own checkpoints
resume bitwise-equal."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest
from helpers.blend import blend_overrides
from helpers.build import compile_build
from helpers.torchrun import assert_rates_follow_the_schedule, run

pytestmark = pytest.mark.slow

PRESET = "tiny_deepspeed_zero3_2rank_cpu_fp32"
NAME = "zero3"


def test_zero3_trains_checkpoints_and_resumes_exactly(tmp_path: Path) -> None:
    build = compile_build(
        tmp_path / "build",
        [
            f"name={NAME}",
            "train.steps=4",
            "train.checkpoint.interval=2",
            "train.log_interval=1",
            "train.eval_interval=2",
            "train.eval_iters=1",
            *blend_overrides(tmp_path / "user"),
        ],
        spec=PRESET,
    ).dir
    assert (build / "ds_config.json").is_file()
    first = run(build, tmp_path)
    assert first.code == 0, first.output[-4000:]
    losses = first.losses(NAME)
    assert sorted(losses) == list(range(1, 5)) and all(math.isfinite(v) for v in losses.values())
    assert losses[4] < losses[1]
    assert_rates_follow_the_schedule(build, first, NAME)
    val = first.val_losses(NAME)
    assert sorted(val) == [2, 4] and all(math.isfinite(v) for v in val.values())
    ckpt = tmp_path / "runs" / NAME / "checkpoints"
    assert (ckpt / "step_4" / "deepspeed" / "state").is_dir()

    shutil.rmtree(ckpt / "step_4")
    (ckpt / "latest").write_text("step_2\n")
    (tmp_path / "runs" / NAME / "metrics.jsonl").unlink()
    resumed = run(build, tmp_path)
    assert resumed.code == 0, resumed.output[-4000:]
    assert f"resumed from runs/{NAME}/checkpoints/step_2 (step 2)" in resumed.output
    again = resumed.losses(NAME)
    assert sorted(again) == [3, 4]
    assert_rates_follow_the_schedule(build, resumed, NAME)
    for step in again:
        assert again[step] == losses[step], step
    assert resumed.val_losses(NAME) == {4: val[4]}


def test_zero2_offload_trains_with_cpu_adam_and_checkpointed_layers(tmp_path: Path) -> None:
    """ZeRO-Offload asks for DeepSpeedCPUAdam and gets it (the cpu_adam op JIT-builds here: g++ and
    ninja; minutes on a cold torch-extensions cache), and train.recompute=full checkpoints every
    decoder layer through DeepSpeed: the run log says both, and the model trains."""
    name = "offload"
    build = compile_build(
        tmp_path / "build",
        [
            f"name={name}",
            "parallel.zero_stage=2",
            "parallel.offload_optimizer=true",
            "train.recompute=full",
            "train.steps=3",
            "train.log_interval=1",
            "train.eval_interval=1000",
            "train.checkpoint.interval=1000",
        ],
        spec=PRESET,
    ).dir
    result = run(build, tmp_path)
    assert result.code == 0, result.output[-4000:]
    assert "lmspec: deepspeed optimizer DeepSpeedCPUAdam; every decoder layer checkpointed" in result.output
    losses = result.losses(name)
    assert sorted(losses) == [1, 2, 3] and all(math.isfinite(v) for v in losses.values())
    assert losses[3] < losses[1]
