"""Each context-parallel rank's share of a micro-batch, through megatron-core's own split.

megatron-core reads only the size and rank of the CP group it is given, so a one-process gloo
group and a stand-in with that size and rank show every rank's share without starting cp ranks.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import torch
import torch.distributed as dist
from helpers.ports import free_port

from lmspec.runtime.train.megatron.context_parallel import this_rank_share


@dataclass(frozen=True)
class _CpGroup:
    """What megatron's get_pg_size/get_pg_rank ask a process group."""

    cp: int
    cp_rank: int

    def size(self) -> int:
        return self.cp

    def rank(self) -> int:
        return self.cp_rank


@pytest.fixture(scope="module", autouse=True)
def _one_process_group() -> Iterator[None]:
    """megatron reads a group's size only once torch.distributed is initialised."""
    if dist.is_initialized():
        yield
        return
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("cp", [2, 4])
def test_each_rank_takes_chunks_r_and_2cp_minus_1_minus_r_of_tokens_labels_and_positions(cp: int) -> None:
    batch, seq = 2, 32
    tokens = torch.arange(batch * seq).reshape(batch, seq)
    labels = tokens + 1000
    positions = torch.arange(seq).unsqueeze(0).expand(batch, seq)  # expanded, as the trainer holds them
    chunk = seq // (2 * cp)
    seen: list[int] = []
    work = []
    for r in range(cp):
        share = this_rank_share(tokens, labels, positions, _CpGroup(cp, r))
        mine = [*range(r * chunk, (r + 1) * chunk), *range((2 * cp - 1 - r) * chunk, (2 * cp - r) * chunk)]
        assert share["position_ids"].tolist() == [mine] * batch
        assert torch.equal(share["tokens"], tokens[:, mine])
        assert torch.equal(share["labels"], labels[:, mine])
        seen += mine
        work.append(sum(p + 1 for p in mine))  # causal attention: query p attends to p + 1 keys
    assert sorted(seen) == list(range(seq))  # every position on exactly one rank
    assert len(set(work)) == 1  # and the same attention work on every rank


def test_one_cp_rank_keeps_the_whole_sequence() -> None:
    tokens = torch.arange(16).reshape(2, 8)
    share = this_rank_share(tokens, tokens, torch.arange(8).expand(2, 8), _CpGroup(1, 0))
    assert torch.equal(share["tokens"], tokens) and share["position_ids"].shape == (2, 8)
