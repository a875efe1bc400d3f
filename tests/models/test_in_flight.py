"""Micro-batches in flight per pipeline stage, against megatron-core 0.16.1's own schedule arithmetic
(`get_pp_rank_microbatches`: the warm-up forwards of each rank; the steady state adds one)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from lmspec.compiler.models.train_memory import in_flight_micro_batches


class _Group:
    def __init__(self, size: int, rank: int) -> None:
        self._size, self._rank = size, rank

    def size(self) -> int:
        return self._size

    def rank(self) -> int:
        return self._rank


@pytest.mark.parametrize("vp", [None, 2, 3])
@pytest.mark.parametrize("pp", [2, 4])
@pytest.mark.parametrize("groups", [1, 2, 5])
def test_in_flight_is_what_the_schedule_keeps(pp: int, vp: int | None, groups: int) -> None:
    from megatron.core.pipeline_parallel.schedules import get_pp_rank_microbatches

    micro_batches = groups * pp  # interleaved: a multiple of pp (compiler/rules/layout.py)
    for stage in range(pp):
        comm = SimpleNamespace(pp_group=_Group(pp, stage), virtual_pipeline_model_parallel_size=vp)
        total, all_warmup, warmup, _ = get_pp_rank_microbatches(
            micro_batches, vp or 1, pp, forward_only=False, p2p_communicator=comm
        )
        chunks_alive = total if all_warmup else warmup + 1
        assert in_flight_micro_batches(pp, stage, micro_batches, vp or 1) == pytest.approx(chunks_alive / (vp or 1))


def test_first_stage_is_korthikantis_interleaved_factor() -> None:
    pp, vp = 4, 2
    assert in_flight_micro_batches(pp, 0, 8, vp) == pytest.approx(pp * (1 + (pp - 1) / (pp * vp)))
