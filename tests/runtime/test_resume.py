"""Checkpoints that survive kill -9, corruption and preemption, and resume bitwise-equal (CPU fp32), on the
Megatron backend (megatron-core's dist_checkpointing) and the torchtitan backend (FSDP2 fully sharded, DCP).

The runs train on a user's data: an HF tokenizer and two megatron-core datasets blended 0.7/0.3, with
validation after steps 4 and 8; a resumed run reproduces the training and the validation losses."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
from helpers.backend_layouts import BACKEND_LAYOUTS
from helpers.blend import blend_overrides
from helpers.build import compile_build
from helpers.torchrun import assert_rates_follow_the_schedule, run, run_until, workers

from lmspec.compiler.backends import BACKENDS
from lmspec.runtime.train.checkpoint import verify

pytestmark = pytest.mark.slow

NAME = "resume"
# tiny at DP=2: 8 steps, a checkpoint every 2, keep the last 2, a metrics line every step, validation every 4.
OVERRIDES = [
    f"name={NAME}",
    "train.steps=8",
    "train.checkpoint.interval=2",
    "train.log_interval=1",
    "train.eval_interval=4",
    "train.eval_iters=2",
]


@pytest.fixture(scope="module", params=sorted(BACKEND_LAYOUTS))
def reference(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """The uninterrupted run every other run here must reproduce, on each backend."""
    root = tmp_path_factory.mktemp("reference")
    layout = BACKEND_LAYOUTS[request.param]
    build = compile_build(root / "build", [*OVERRIDES, *layout, *blend_overrides(root / "user")]).dir
    result = run(build, root)
    assert result.code == 0, result.output[-4000:]
    assert sorted(result.val_losses(NAME)) == [4, 8]
    assert "lmspec: validation loss at step 4: " in result.output
    assert_rates_follow_the_schedule(build, result, NAME)
    return build, result


def _backend_dir(build: Path) -> str:
    """Where the build's backend saves inside a step directory (its TrainingBackend.checkpoint_dir)."""
    backend = next(name for name in BACKENDS if (build / BACKENDS[name].config_file).exists())
    return BACKENDS[backend].checkpoint_dir


def _checkpoints(cwd: Path) -> Path:
    return cwd / "runs" / NAME / "checkpoints"


def test_kill9_worker_mid_save_then_resume_matches_uninterrupted(reference, tmp_path: Path) -> None:
    build, ref = reference
    tmp_save = _checkpoints(tmp_path) / ".tmp-step_4"
    killed: list[int] = []

    def kill_one_worker(proc: subprocess.Popen) -> None:
        pid = workers(proc)[-1]
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)

    crashed = run_until(build, tmp_path, tmp_save.exists, kill_one_worker)
    assert killed and crashed.code != 0
    ckpt = _checkpoints(tmp_path)
    assert (ckpt / "latest").read_text().strip() == "step_2"  # the pointer never names a partial save
    assert not (ckpt / "step_4" / "manifest.json").is_file()

    resumed = run(build, tmp_path)
    assert resumed.code == 0, resumed.output[-4000:]
    assert f"resumed from runs/{NAME}/checkpoints/step_2 (step 2)" in resumed.output
    ref_losses, losses = ref.losses(NAME), resumed.losses(NAME)
    assert sorted(losses) == list(range(1, 9))
    for step in range(3, 9):  # bitwise: same floats, not approximately
        assert losses[step] == ref_losses[step], step
    assert_rates_follow_the_schedule(build, resumed, NAME)  # megatron's scheduler stepped straight to step 3
    assert resumed.val_losses(NAME) == ref.val_losses(NAME)
    assert (ckpt / "latest").read_text().strip() == "step_8"


def test_corrupt_checkpoint_falls_back_to_previous(reference, tmp_path: Path) -> None:
    build, ref = reference
    shutil.copytree(_checkpoints(ref.cwd), _checkpoints(tmp_path))
    ckpt = _checkpoints(tmp_path)
    assert (ckpt / "latest").read_text().strip() == "step_8"
    victim = sorted((ckpt / "step_8" / _backend_dir(build)).glob("*.distcp"))[0]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))

    resumed = run(build, tmp_path)
    assert resumed.code == 0, resumed.output[-4000:]
    assert "checkpoint step_8 is not usable" in resumed.output and victim.name in resumed.output
    assert f"resumed from runs/{NAME}/checkpoints/step_6 (step 6)" in resumed.output
    ref_losses, losses = ref.losses(NAME), resumed.losses(NAME)
    assert losses[7] == ref_losses[7] and losses[8] == ref_losses[8]


def test_sigusr1_checkpoints_and_exits_for_requeue(reference, tmp_path: Path) -> None:
    build, _ = reference
    metrics = tmp_path / "runs" / NAME / "metrics.jsonl"

    def three_steps_done() -> bool:
        return metrics.is_file() and len(metrics.read_text().splitlines()) >= 3

    def preempt(proc: subprocess.Popen) -> None:  # what Slurm's --signal / scancel --signal does
        for pid in workers(proc):
            os.kill(pid, signal.SIGUSR1)

    stopped = run_until(build, tmp_path, three_steps_done, preempt)
    assert stopped.code != 0  # torchrun reports the workers' requeue exit code as a failure
    assert "SIGUSR1 received: checkpointed at step" in stopped.output and "exit 3 (requeue)" in stopped.output
    step = int(re.search(r"checkpointed at step (\d+)", stopped.output).group(1))
    assert 3 <= step < 8  # stopped early, right after the signal, not at a checkpoint interval only
    ckpt = _checkpoints(tmp_path)
    assert (ckpt / "latest").read_text().strip() == f"step_{step}"
    assert verify(ckpt / f"step_{step}") is None  # complete; resuming from such a one is covered above
