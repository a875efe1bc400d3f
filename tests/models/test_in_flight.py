"""Micro-batches in flight per pipeline stage, against megatron-core 0.16.1's own schedule arithmetic
(`get_pp_rank_microbatches`: the warm-up forwards of each rank; the steady state adds one)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from lmspec.compiler.models.dims import chunk_layers
from lmspec.compiler.models.train_memory import in_flight_micro_batches


class _Group:
    def __init__(self, size: int, rank: int) -> None:
        self._size, self._rank = size, rank

    def size(self) -> int:
        return self._size

    def rank(self) -> int:
        return self._rank


def _chunks_alive(pp: int, stage: int, micro_batches: int, vp: int | None, overlap: bool) -> int:
    from megatron.core.pipeline_parallel.schedules import get_pp_rank_microbatches

    comm = SimpleNamespace(pp_group=_Group(pp, stage), virtual_pipeline_model_parallel_size=vp)
    total, all_warmup, warmup, _ = get_pp_rank_microbatches(
        micro_batches, vp or 1, pp, forward_only=False, p2p_communicator=comm, overlap_moe_expert_parallel_comm=overlap
    )
    return total if all_warmup else warmup + 1


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("vp", [None, 2, 3])
@pytest.mark.parametrize("pp", [2, 4])
@pytest.mark.parametrize("groups", [1, 2, 5])
def test_in_flight_is_what_the_schedule_keeps(pp: int, vp: int | None, groups: int, overlap: bool) -> None:
    if overlap and vp is None:
        pytest.skip("the all-to-all overlap on a pipeline needs virtual stages (rules/overlap.py)")
    micro_batches = groups * pp  # interleaved: a multiple of pp (compiler/rules/layout.py)
    layers = 6  # splits evenly into 1, 2 or 3 chunks: each chunk is 1/v of the stage
    for stage in range(pp):
        alive = _chunks_alive(pp, stage, micro_batches, vp, overlap)
        estimate = in_flight_micro_batches(pp, stage, micro_batches, vp or 1, layers, int(overlap))
        assert estimate == pytest.approx(alive / (vp or 1))


@pytest.mark.parametrize(("layers", "vp"), [(4, 3), (5, 2), (5, 3), (2, 3), (7, 4)])
@pytest.mark.parametrize("pp", [2, 4])
def test_uneven_chunks_weigh_the_chunks_the_warm_up_runs(layers: int, vp: int, pp: int) -> None:
    """Forward k runs chunk (k // pp) mod v (megatron-core's get_model_chunk_id); the chunks are
    dims.chunk_layers' split of the stage, the first ones a layer longer: the layers of the chunks alive."""
    chunks = chunk_layers((layers,), vp)
    micro_batches = 3 * pp
    for stage in range(pp):
        alive = _chunks_alive(pp, stage, micro_batches, vp, False)
        held = sum(chunks[(k // pp) % vp] for k in range(alive))
        assert in_flight_micro_batches(pp, stage, micro_batches, vp, layers) == pytest.approx(held / layers)


def test_without_a_pipeline_the_overlap_keeps_two_micro_batches() -> None:
    assert in_flight_micro_batches(1, 0, 8, 1, 4, a2a_overlap=1) == 2
    assert in_flight_micro_batches(1, 0, 8, 1, 4) == 1


def test_first_stage_is_korthikantis_interleaved_factor() -> None:
    pp, vp = 4, 2
    assert in_flight_micro_batches(pp, 0, 8, vp, 8) == pytest.approx(pp * (1 + (pp - 1) / (pp * vp)))
