"""Asynchronous saves (train.checkpoint.async_save=true) keep the crash safety of synchronous ones.

The same runs as tests/runtime/test_resume.py (CPU fp32, two gloo ranks, a blend of the user's data; the
megatron and torchtitan backends), each save written in the background while training goes on (megatron-core's
async request in a forked writer; torchtitan's dcp.async_save in a thread): a rank
killed with SIGKILL while step 4 persists leaves `latest` at step 2 and the resumed run reproduces
the uninterrupted one bitwise; SIGUSR1 while a save is in flight waits for it, saves the step it
stopped at and exits for requeue."""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

import pytest
from helpers.backend_layouts import BACKEND_LAYOUTS
from helpers.blend import blend_overrides
from helpers.build import compile_build
from helpers.torchrun import run, run_until, workers

from lmspec.runtime.train.checkpoint import read_manifest, verify

pytestmark = pytest.mark.slow

NAME = "async"
OVERRIDES = [
    f"name={NAME}",
    "train.steps=8",
    "train.checkpoint.interval=2",
    "train.checkpoint.async_save=true",
    "train.log_interval=1",
    "train.eval_interval=4",
    "train.eval_iters=2",
]


@pytest.fixture(scope="module", params=sorted(BACKEND_LAYOUTS))
def reference(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """The uninterrupted asynchronous run: every save committed, in order, with digests taken as written."""
    root = tmp_path_factory.mktemp("reference")
    layout = BACKEND_LAYOUTS[request.param]
    build = compile_build(root / "build", [*OVERRIDES, *layout, *blend_overrides(root / "user")]).dir
    result = run(build, root)
    assert result.code == 0, result.output[-4000:]
    for step in (2, 4, 6, 8):
        assert f"lmspec: saving step_{step} in the background" in result.output
        assert f"lmspec: saved runs/{NAME}/checkpoints/step_{step}" in result.output
    ckpt = _checkpoints(root)
    manifest, _ = read_manifest(ckpt / "step_8")
    assert manifest is not None and manifest.algorithm == "xxh3_128"
    assert verify(ckpt / "step_8") is None
    return build, result


def _checkpoints(cwd: Path) -> Path:
    return cwd / "runs" / NAME / "checkpoints"


def test_kill9_during_a_background_persist_keeps_latest_and_resumes_bitwise(reference, tmp_path: Path) -> None:
    build, ref = reference
    staged = _checkpoints(tmp_path) / ".tmp-step_4" / "trainer_state"  # written once step 4 is staged

    def kill_one_worker(proc: subprocess.Popen) -> None:
        os.kill(workers(proc)[-1], signal.SIGKILL)

    crashed = run_until(build, tmp_path, staged.exists, kill_one_worker)
    assert crashed.code != 0
    ckpt = _checkpoints(tmp_path)
    assert (ckpt / "latest").read_text().strip() == "step_2"  # the commit never ran
    assert not (ckpt / "step_4").exists()

    resumed = run(build, tmp_path)
    assert resumed.code == 0, resumed.output[-4000:]
    assert f"resumed from runs/{NAME}/checkpoints/step_2 (step 2)" in resumed.output
    ref_losses, losses = ref.losses(NAME), resumed.losses(NAME)
    for step in range(3, 9):  # bitwise: same floats, not approximately
        assert losses[step] == ref_losses[step], step
    assert resumed.val_losses(NAME) == ref.val_losses(NAME)
    assert (ckpt / "latest").read_text().strip() == "step_8"


def test_sigusr1_waits_for_the_persist_in_flight_then_saves(reference, tmp_path: Path) -> None:
    build, _ = reference
    in_flight = _checkpoints(tmp_path) / ".tmp-step_2" / "trainer_state"

    def preempt(proc: subprocess.Popen) -> None:  # what Slurm's --signal / scancel --signal does
        for pid in workers(proc):
            os.kill(pid, signal.SIGUSR1)

    stopped = run_until(build, tmp_path, in_flight.exists, preempt)
    assert stopped.code != 0  # torchrun reports the workers' requeue exit code as a failure
    assert "SIGUSR1 received: checkpointed at step" in stopped.output, stopped.output[-4000:]
    step = int(re.search(r"checkpointed at step (\d+)", stopped.output).group(1))
    ckpt = _checkpoints(tmp_path)
    assert f"lmspec: saved runs/{NAME}/checkpoints/step_2" in stopped.output  # the one in flight, committed
    assert (ckpt / "latest").read_text().strip() == f"step_{step}"
    assert verify(ckpt / f"step_{step}") is None
    assert not list(ckpt.glob(".tmp-*"))
