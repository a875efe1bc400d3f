"""torchtitan's asynchronous checkpoint (checkpoint.async_mode="async") under lmspec's Saver.

torchtitan saves with `dcp.async_save` over a gloo process group of its own: the state is staged into host
memory before the call returns (DCP's BlockingAsyncStager copies every tensor, on a CPU host too, so training
may change the weights at once) and a thread writes the files. lmspec.runtime.train.saving runs its commit
(digests, manifest, `latest`) only when every rank's write has finished, as it does for megatron-core's
forked writers: this module gives the DCP future the two shapes the Saver drives, megatron-core's
AsyncRequest (finalize functions, a synchronous wait) and AsyncCallsQueue (one request in flight, finished
when a MIN all-reduce over the ranks says every writer is done).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future

import torch
import torch.distributed as dist


class DcpAsyncRequest:
    """One `dcp.async_save` in flight and what runs once every rank has written its files."""

    def __init__(self, written: Future) -> None:
        self.written = written
        self.finalize_fns: list[Callable[[], None]] = []

    def add_finalize_fn(self, fn: Callable[[], None]) -> None:
        self.finalize_fns.append(fn)

    def execute_sync(self) -> None:
        """Wait for this rank's write (raising what the writer raised), then finalise."""
        self.written.result()
        self.finalize()

    def finalize(self) -> None:
        for fn in self.finalize_fns:
            fn()


class DcpAsyncQueue:
    """The background save in flight (one at a time: the Saver waits for it before the next)."""

    def __init__(self) -> None:
        self.request: DcpAsyncRequest | None = None

    def schedule_async_request(self, request: DcpAsyncRequest) -> None:
        self.request = request

    def get_num_unfinalized_calls(self) -> int:
        return int(self.request is not None)

    def maybe_finalize_async_calls(self, blocking: bool) -> None:
        """Finalise the request once every rank's write has finished (a collective on every rank); `blocking`
        waits for this rank's write first."""
        if self.request is None:
            return
        if blocking:
            self.request.written.result()
        done = torch.tensor([int(self.request.written.done())], dtype=torch.int32)
        dist.all_reduce(done, op=dist.ReduceOp.MIN)
        if done.item():
            request, self.request = self.request, None
            request.execute_sync()
