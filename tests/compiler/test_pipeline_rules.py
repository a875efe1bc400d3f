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


def test_more_chunks_than_any_stage_has_layers_is_a_warning(lmspec) -> None:
    """megatron-core builds chunks past a stage's layers empty; where every stage has one they only add hops."""
    result = lmspec("check", *PP2, "parallel.virtual_stages=3")
    assert result.code == 0, result.err
    result.assert_reports(
        0,
        [
            "parallel.virtual_stages=3 (command-line override) splits each pipeline stage into 3 model chunks",
            "the stages hold [2, 2] layers (model.num_layers=4 (lmspec:specs/model/tiny.yaml:7) / parallel.pp=2",
            "every stage runs a chunk without a layer",
            "set parallel.virtual_stages to at most 2 (the longest stage's layers), or to null",
        ],
    )


@pytest.mark.parametrize(
    "overrides",
    [
        [*PP2, "parallel.virtual_stages=2"],
        [*PP2, "parallel.virtual_stages=2", "model.num_layers=6", "parallel.pp_layout=[4,2]"],
        [*PP2, "parallel.virtual_stages=2", "parallel.pp_layout=[1,3]"],  # chunks [1, 0] and [2, 1]
        [*PP2, "parallel.virtual_stages=2", "model.num_layers=5", "parallel.pp_layout=auto"],  # [1, 1], [2, 1]
        [*PP2, "parallel.virtual_stages=3", "model.num_layers=5", "parallel.pp_layout=auto"],  # [1, 1, 0], [1, 1, 1]
        ["train.init_from=runs/base/checkpoints/step_20"],
    ],
    ids=["even", "uneven-stages", "an-empty-chunk", "uneven-chunks", "uneven-and-empty", "init-from"],
)
def test_accepted(lmspec, overrides: list[str]) -> None:
    result = lmspec("check", *overrides)
    assert result.code == 0, result.err
    assert "parallel.virtual_stages" not in result.err, result.err


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


@pytest.mark.parametrize(
    ("stages", "v", "chunks"),
    [
        ((4, 3), 3, (2, 1, 1, 1, 1, 1)),  # DeepSeek-V3's 61 layers on PP16 VP3: stages of 4 and 3 layers
        ((2, 3), 2, (1, 2, 1, 1)),
        ((1, 3), 2, (1, 2, 0, 1)),
        ((4, 2), None, (4, 2)),
    ],
)
def test_uneven_chunks_megatron_accepts(stages: tuple[int, ...], v: int | None, chunks: tuple[int, ...]) -> None:
    """The first chunks of a stage take one more layer; megatron-core's layout class accepts the split, an empty
    chunk included, and builds each rank's chunks with those layers."""
    from megatron.core.transformer.enums import LayerType
    from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout

    assert chunk_layers(stages, v) == chunks
    assert sum(chunks) == sum(stages)
    layout = PipelineParallelLayerLayout(pipeline_layout(stages, v, mtp_layers=1), pipeline_model_parallel_size=2)
    assert layout.virtual_pipeline_model_parallel_size == (v or 1)
    layout.validate_layer_layout(num_layers=sum(stages), mtp_num_layers=1)
    built = [[chunk.count(LayerType.decoder) for chunk in rank] for rank in layout.layout]
    assert built == [list(chunks[r :: len(stages)]) for r in range(len(stages))]
