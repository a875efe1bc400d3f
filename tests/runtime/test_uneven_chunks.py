"""Interleaved 1F1B with uneven model chunks on 2 CPU ranks (megatron-core 0.16.1, tiny with 5 layers).

5 layers on 2 pipeline stages are [2, 3] (balanced, the first stage a layer fewer); in 2 chunks per
rank they split [1, 1] and [2, 1], in 3 chunks [1, 1, 0] and [1, 1, 1] (compiler.models.dims.chunk_layers:
the first chunks take one more, a stage of fewer layers than chunks leaves its last one empty). As in
test_interleaved_pipeline.py, every sample is the same sequence, so a run started from the source's
step_2 weights logs at its step 1 the loss the source logged at its step 3: the uneven chunks hold every
layer, in order. From the same weights (and a fresh optimizer, as train.init_from starts) the two chunk
splits then take the same step: backward and update run through uneven and empty chunks alike.

Tolerance: FP32_ABS = 1e-5 on losses of ~5: the layouts differ only in the order of fp32 reductions.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from helpers.same_batch import same_batch_workdir, train_on_the_batch
from helpers.torchrun import Run

pytestmark = pytest.mark.slow

FP32_ABS = 1e-5
COMMON = ["model.num_layers=5", "train.log_interval=1", "train.eval_interval=100", "train.checkpoint.interval=2"]
FROM_SOURCE = "train.init_from=runs/source/checkpoints/step_2"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return same_batch_workdir(tmp_path_factory.mktemp("uneven"), "uneven chunks hold one layer more in front; ")


def _train(workdir: Path, name: str, overrides: list[str]) -> Run:
    return train_on_the_batch(workdir, name, [*COMMON, *overrides])


@pytest.fixture(scope="module")
def source(workdir: Path) -> Run:
    """TP=2, 3 steps: checkpoint step_2."""
    return _train(workdir, "source", ["parallel.tp=2", "train.steps=3"])


@pytest.fixture(scope="module")
def uneven(workdir: Path, source: Run) -> dict[int, Run]:
    """PP=2 with 2 and with 3 chunks per rank, from the source's step_2 weights, 2 steps each."""
    return {
        v: _train(
            workdir,
            f"vp{v}",
            ["parallel.pp=2", "parallel.pp_layout=auto", f"parallel.virtual_stages={v}", "train.steps=2", FROM_SOURCE],
        )
        for v in (2, 3)
    }


def test_megatron_builds_the_uneven_chunks(uneven: dict[int, Run]) -> None:
    assert "pipeline stage 0/2: 2 layers in 2 chunks of [1, 1]" in uneven[2].output
    assert "pipeline stage 1/2: 3 layers in 2 chunks of [2, 1]" in uneven[2].output
    assert "pipeline stage 0/2: 2 layers in 3 chunks of [1, 1, 0]" in uneven[3].output
    assert "pipeline stage 1/2: 3 layers in 3 chunks of [1, 1, 1]" in uneven[3].output


def test_uneven_chunks_compute_the_sources_model(source: Run, uneven: dict[int, Run]) -> None:
    src = source.losses("source")
    assert src[3] < src[1] - 0.5  # the source learned: step_2's weights are not the seed's
    for v, result in uneven.items():
        losses = result.losses(f"vp{v}")
        assert sorted(losses) == [1, 2] and all(math.isfinite(loss) for loss in losses.values()), v
        assert losses[1] == pytest.approx(src[3], abs=FP32_ABS), v  # the weights after step 2 on the one batch


def test_an_empty_chunk_trains_as_the_uneven_split(uneven: dict[int, Run]) -> None:
    two, three = uneven[2].losses("vp2"), uneven[3].losses("vp3")
    assert three[2] == pytest.approx(two[2], abs=FP32_ABS)
    assert three[2] < three[1]
