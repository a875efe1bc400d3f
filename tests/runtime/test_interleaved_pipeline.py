"""Interleaved 1F1B and train.init_from on 2 CPU ranks (megatron-core 0.16.1, tiny: 4 layers).

The data is a corpus of identical documents of exactly train.seq_length tokens (127 bytes and the
end-of-text id), so every sample, and so every batch, is the same sequence: a run's loss at step k
is then the loss of the weights after step k - 1 on THE batch, whatever the data order. That makes
init_from exact: a run started from the source's step_2 weights logs at its step 1 the loss the
source logged at its step 3 (same weights, same batch), at another layout (TP=2 -> PP=2 x 2 virtual
stages). From the same initial weights, PP=2 with and without virtual stages then train alike, and
a virtual-stage checkpoint resumes at PP=2 without them.

Tolerance: FP32_ABS = 1e-5 on losses of ~5: the layouts differ only in the order of fp32
reductions (TP all-reduce, the gradient norm summed over other chunks).
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest
from helpers.convert import lmspec
from helpers.same_batch import same_batch_workdir, train_on_the_batch
from helpers.torchrun import Run

pytestmark = pytest.mark.slow

FP32_ABS = 1e-5
COMMON = ["train.log_interval=1", "train.eval_interval=2", "train.checkpoint.interval=2"]
FROM_SOURCE = "train.init_from=runs/source/checkpoints/step_2"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return same_batch_workdir(
        tmp_path_factory.mktemp("interleaved"), "interleaved pipelines run model chunks in turn; "
    )


def _train(workdir: Path, name: str, overrides: list[str]) -> Run:
    return train_on_the_batch(workdir, name, [*COMMON, *overrides])


@pytest.fixture(scope="module")
def source(workdir: Path) -> Run:
    """TP=2, 3 steps: checkpoints step_2 and step_3."""
    return _train(workdir, "source", ["parallel.tp=2", "train.steps=3"])


@pytest.fixture(scope="module")
def interleaved(workdir: Path, source: Run) -> Run:
    """PP=2 x 2 virtual stages from the source's step_2 weights, 4 steps."""
    return _train(workdir, "vp", ["parallel.pp=2", "parallel.virtual_stages=2", "train.steps=4", FROM_SOURCE])


def test_interleaved_builds_two_chunks_per_rank(interleaved: Run) -> None:
    assert "pipeline stage 0/2: 2 layers in 2 chunks of [1, 1]" in interleaved.output
    assert "pipeline stage 1/2: 2 layers in 2 chunks of [1, 1]" in interleaved.output
    losses = interleaved.losses("vp")
    assert sorted(losses) == [1, 2, 3, 4] and all(math.isfinite(loss) for loss in losses.values())
    assert sorted(interleaved.val_losses("vp")) == [2, 4]  # forward-only interleaved schedule


def test_init_from_continues_the_source_weights_at_another_layout(source: Run, interleaved: Run) -> None:
    assert "lmspec: initialised from runs/source/checkpoints/step_2" in interleaved.output
    src, vp = source.losses("source"), interleaved.losses("vp")
    assert src[3] < src[1] - 0.5  # the source learned: step_2's weights are not the seed's
    assert vp[1] == pytest.approx(src[3], abs=FP32_ABS)  # the weights after step 2 on the one batch


def test_interleaved_trains_as_plain_1f1b_from_the_same_weights(workdir: Path, interleaved: Run) -> None:
    plain = _train(workdir, "pp", ["parallel.pp=2", "train.steps=4", FROM_SOURCE])
    pp, vp = plain.losses("pp"), interleaved.losses("vp")
    assert sorted(pp) == sorted(vp)
    for step in vp:
        assert pp[step] == pytest.approx(vp[step], abs=FP32_ABS), step
    for step, loss in interleaved.val_losses("vp").items():
        assert plain.val_losses("pp")[step] == pytest.approx(loss, abs=FP32_ABS), step


def test_interleaved_checkpoint_resumes_without_virtual_stages(workdir: Path, interleaved: Run) -> None:
    ckpt = workdir / "runs" / "resumed" / "checkpoints"
    shutil.copytree(workdir / "runs" / "vp" / "checkpoints", ckpt)
    shutil.rmtree(ckpt / "step_4")
    (ckpt / "latest").write_text("step_2\n")
    resumed = _train(workdir, "resumed", ["parallel.pp=2", "train.steps=4"])
    assert "resumed from runs/resumed/checkpoints/step_2 (step 2)" in resumed.output
    vp, pp = interleaved.losses("vp"), resumed.losses("resumed")
    assert sorted(pp) == [3, 4]
    for step in pp:  # weights and Adam states of both chunks, now one chunk per rank
        assert pp[step] == pytest.approx(vp[step], abs=FP32_ABS), step


def test_interleaved_checkpoint_converts_and_verifies(workdir: Path, interleaved: Run) -> None:
    build = workdir / "build" / "vp"
    converted = lmspec("run", str(build), "--stage", "convert", cwd=workdir)
    assert converted.returncode == 0, converted.stderr[-3000:]
    verified = lmspec("run", str(build), "--stage", "verify", cwd=workdir)
    assert verified.returncode == 0, verified.stderr[-3000:]
    assert '"ok": true' in verified.stdout
