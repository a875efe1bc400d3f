"""Rules of interleaved 1F1B (parallel.virtual_stages) and train.init_from: golden errors, what
they accept, and the chunk split megatron-core builds from the Plan's stages."""

from __future__ import annotations

import pytest

from lmspec.compiler.backends.megatron_config import pipeline_layout
from lmspec.compiler.models.dims import chunk_layers

PP2 = ["parallel.pp=2"]

CASES = [
    pytest.param(
        [*PP2, "parallel.virtual_stages=1"],
        ["parallel.virtual_stages=1 (command-line override) is one model chunk per rank", "set it to null"],
        id="one-chunk",
    ),
    pytest.param(
        [*PP2, "parallel.virtual_stages=2", "parallel.pp_layout=[1,3]"],
        [
            "parallel.virtual_stages=2 (command-line override) splits every pipeline stage's layers into 2 equal",
            "the stages hold [1, 3] layers (parallel.pp_layout=[1, 3] (command-line override))",
            "or set it to null",
        ],
        id="chunks-uneven",
    ),
    pytest.param(
        [*PP2, "parallel.virtual_stages=4"],
        ["the stages hold [2, 2] layers", "model.num_layers=4 (lmspec:specs/model/tiny.yaml:7)", "valid: 2"],
        id="chunks-without-layers",
    ),
    pytest.param(
        [*PP2, "parallel.virtual_stages=2", "train.global_batch_size=12"],
        [
            "runs a step's micro-batches in groups of parallel.pp(2), but a step has 3",
            "train.global_batch_size(12) / (train.micro_batch_size(4) x dp(1))",
            "set train.global_batch_size=16",
        ],
        id="micro-batches-in-groups-of-pp",
    ),
    pytest.param(
        ["train.init_from=runs/base/checkpoints"],
        [
            "train.init_from=\"runs/base/checkpoints\" (command-line override) ends in 'checkpoints'",
            "e.g. 'runs/base/checkpoints/step_<N>'",
        ],
        id="init-from-not-a-step",
    ),
    pytest.param(
        ["train.init_from=runs/base/checkpoints/step_20/torch_dist"],
        ["ends in 'torch_dist'", "e.g. 'runs/base/checkpoints/step_20'"],
        id="init-from-inside-a-step",
    ),
    pytest.param(
        ["train.init_from=runs/tiny/checkpoints/step_20"],
        [
            'train.init_from="runs/tiny/checkpoints/step_20" (command-line override) is inside '
            'train.checkpoint.dir="runs/tiny/checkpoints"',
            "is resumed instead of initialising from train.init_from",
            "give this run a train.checkpoint.dir of its own",
        ],
        id="init-from-own-checkpoints",
    ),
]


@pytest.mark.parametrize(("overrides", "expected"), CASES)
def test_rule_reports_key_factors_origin_and_fix(lmspec, overrides: list[str], expected: list[str]) -> None:
    lmspec("check", *overrides).assert_reports(1, expected)


@pytest.mark.parametrize(
    "overrides",
    [
        [*PP2, "parallel.virtual_stages=2"],
        [*PP2, "parallel.virtual_stages=2", "model.num_layers=6", "parallel.pp_layout=[4,2]"],
        ["train.init_from=runs/base/checkpoints/step_20"],
    ],
    ids=["even", "uneven-stages", "init-from"],
)
def test_accepted(lmspec, overrides: list[str]) -> None:
    result = lmspec("check", *overrides)
    assert result.code == 0, result.err


def test_megatron_builds_the_chunks_the_plan_splits(monkeypatch: pytest.MonkeyPatch) -> None:
    """megatron-core's own layout class reads lmspec's chunk list: each rank's chunk c holds its stage's
    layers / v, and the model's layers run chunk 0 of every stage, then chunk 1."""
    from megatron.core import parallel_state
    from megatron.core.transformer.enums import LayerType
    from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout

    stages, v = (4, 2), 2
    assert chunk_layers(stages, v) == (2, 1, 2, 1)
    layout = PipelineParallelLayerLayout(pipeline_layout(stages, v), pipeline_model_parallel_size=2)
    assert layout.virtual_pipeline_model_parallel_size == v
    layout.validate_layer_layout(num_layers=6, mtp_num_layers=None)
    held = [[[i for i, t in enumerate(chunk) if t == LayerType.decoder] for chunk in rank] for rank in layout.layout]
    assert [[len(chunk) for chunk in rank] for rank in held] == [[2, 2], [1, 1]]
    # what initialize_model_parallel(virtual_pipeline_model_parallel_size=v) sets, for the offset lookup
    monkeypatch.setattr(parallel_state, "_VIRTUAL_PIPELINE_MODEL_PARALLEL_WORLD_SIZE", v)
    offsets = [[layout.get_layer_offset(vp_stage=c, pp_rank=r) for c in range(v)] for r in range(2)]
    assert offsets == [[0, 3], [2, 5]]  # rank 0: layers 0-1 and 3-4; rank 1: layer 2 and layer 5
