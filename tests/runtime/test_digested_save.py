"""Each file megatron-core's writers write is digested as it is written, and the digest is the file's.

One gloo rank saves a small sharded state through dist_checkpointing's asynchronous request, run in
place (execute_sync) and in the background (AsyncCallsQueue), with lmspec.runtime.train.megatron.
digested_save's transform in front of DCP's; every digest handed back must equal the digest of the
file read back afterwards, and every data file must have one."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from lmspec.runtime.compat.megatron import megatron_on_cpu
from lmspec.runtime.train.digest import file_digest
from lmspec.runtime.train.megatron.digested_save import Digests


@pytest.fixture
def one_rank(tmp_path: Path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        with megatron_on_cpu():
            yield
    finally:
        dist.destroy_process_group()


def _state() -> dict:
    from megatron.core.dist_checkpointing import ShardedTensor

    gen = torch.Generator().manual_seed(0)
    return {
        f"w{i}": ShardedTensor.from_rank_offsets(f"layer.{i}.weight", torch.randn(64, 32, generator=gen), replica_id=0)
        for i in range(6)
    }


def _request(target: Path):
    from megatron.core import dist_checkpointing

    target.mkdir(parents=True)
    return dist_checkpointing.save(_state(), str(target), async_sharded_save=True)


@pytest.mark.usefixtures("one_rank")
@pytest.mark.parametrize("background", [False, True], ids=["in-place", "background"])
def test_digests_taken_while_writing_match_the_files(tmp_path: Path, background: bool) -> None:
    from megatron.core.dist_checkpointing.strategies.async_utils import AsyncCallsQueue

    step = tmp_path / "step"
    digests = Digests(step)
    request = digests.wrap(_request(step / "torch_dist"))
    if background:
        queue = AsyncCallsQueue(persistent=False)
        queue.schedule_async_request(request)
        queue.maybe_finalize_async_calls(blocking=True)
    else:
        request.execute_sync()
    found = digests.collect()
    data_files = sorted(p.relative_to(step).as_posix() for p in step.rglob("*.distcp"))
    assert data_files and sorted(found) == data_files
    for rel, value in found.items():
        assert value == file_digest(step / rel), rel
