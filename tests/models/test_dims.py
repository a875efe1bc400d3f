"""ParallelDims: one spec's degrees, and the same properties on arrays of candidates."""

from __future__ import annotations

import numpy as np
import pytest

from lmspec.compiler.models.dims import ParallelDims

from .conftest import spec_of

DEEPSEEK = ["model=deepseek_v3", "hardware=h800_80g", "hardware.nodes=256", "train.global_batch_size=15360"]


def test_deepseek_v3_published_layout() -> None:
    """DeepSeek-V3's 2048 H800s: PP16 x EP64, dp 128, experts replicated twice."""
    dims = ParallelDims.from_spec(spec_of(*DEEPSEEK, "parallel.pp=16", "parallel.ep=64", "parallel.pp_layout=auto"))
    assert dims is not None
    assert (dims.world, dims.dp, dims.dense_dp, dims.expert_dp) == (2048, 128, 128, 2)
    assert dims.micro_batches == 15360 // 128
    assert sum(dims.stage_layers) == 61 and len(dims.stage_layers) == 16
    assert dims.ep_span == 64 and dims.spans_nodes(dims.ep_span)  # EP64 leaves the 8-GPU node
    assert dims.expert_dp_span == 128 and dims.dense_dp_span == 128 and dims.pp_span == 2048
    assert dims.device == "gpu"


def test_illegal_layouts_have_no_dims() -> None:
    assert ParallelDims.from_spec(spec_of("model=llama3_8b", "hardware=h100_80g", "parallel.tp=3")) is None
    assert ParallelDims.from_spec(spec_of("model=llama3_8b", "hardware=h100_80g", "parallel.pp=5")) is None


def test_cpu_ranks_are_a_cpu_device() -> None:
    dims = ParallelDims.from_spec(spec_of("hardware=cpu"))
    assert dims is not None and dims.device == "cpu" and not dims.spans_nodes(dims.dense_dp_span)


ROWS = [(1, 2, 4, 1, 2), (2, 4, 2, 1, 4), (4, 2, 1, 2, 8)]  # nodes, tp, pp, cp, ep


@pytest.mark.parametrize("layout", ROWS, ids=str)
def test_arrays_give_what_each_spec_gives(layout: tuple[int, int, int, int, int]) -> None:
    """The search builds ParallelDims from candidate columns; each element equals that layout's own."""
    nodes, tp, pp, cp, ep = layout
    spec = spec_of(
        "model=mixtral_8x7b",
        "hardware=h100_80g",
        f"hardware.nodes={nodes}",
        f"parallel.tp={tp}",
        f"parallel.pp={pp}",
        f"parallel.cp={cp}",
        f"parallel.ep={ep}",
        "train.global_batch_size=128",
    )
    one = ParallelDims.from_spec(spec)
    assert one is not None
    columns = [np.array(column) for column in zip(*ROWS)]
    dp = columns[0] * 8 // (columns[1] * columns[2] * columns[3])
    many = ParallelDims(
        gpus_per_node=8,
        nodes=columns[0],
        tp=columns[1],
        pp=columns[2],
        cp=columns[3],
        ep=columns[4],
        etp=1,
        dp=dp,
        micro_batches=128 // dp,
    )
    i = ROWS.index(layout)
    for name in ("world", "dense_dp", "expert_dp", "dense_dp_span", "ep_span", "expert_dp_span", "pp_span"):
        assert getattr(many, name)[i] == getattr(one, name), name
    assert many.spans_nodes(many.dense_dp_span)[i] == one.spans_nodes(one.dense_dp_span)
