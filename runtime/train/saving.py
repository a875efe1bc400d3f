"""A checkpoint save, written while training waits or in the background (`train.checkpoint.async`).

A save has three parts (issue 40). The staging copy: the trainer hands over this rank's share of the
state (megatron-core's fully parallel strategy spreads the replicated shards over the data-parallel
ranks) and the request copies it to host memory - on a GPU a device-to-host copy, on CPU the fork of
the writer, whose pages the training process then changes copy-on-write. The persist: writer processes
write the files, digesting each as they write it (lmspec.runtime.train.megatron.digested_save) and
fsyncing it. The commit (Checkpoints.commit): the ranks gather the digests, rank 0 writes the
manifest, renames the step directory and moves `latest`.

Synchronously (the default) the rank runs all three before the next step. Asynchronously it runs the
staging copy and returns to training; the trainer's queue runs the persist (megatron-core's AsyncCallsQueue
in a forked process; torchtitan's dcp.async_save in a thread, lmspec.runtime.train.torchtitan.async_save),
and `poll` - called after every step, a one-integer all-reduce while a save is in flight -
runs the commit once every rank's writer has finished, as Megatron-LM's `--async-save` does. One save
is in flight at a time: a save due while the previous one still persists waits for it first.

Crash safety is the commit's: `latest` moves only in the commit, after every writer has fsynced, so a
rank killed during a persist leaves the previous `latest`. A stop (Slurm's USR1, SIGTERM) waits for the
persist in flight, then saves and waits for that one too. Staging and scheduling run with the stop
signals blocked (lmspec.runtime.train.signals), so the forked writers never see one.
"""

from __future__ import annotations

import io
import logging
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.distributed as dist

from lmspec.compiler.build.files import TRAINER_STATE
from lmspec.runtime.train.digest import write_digested
from lmspec.runtime.train.signals import stop_signals_blocked

if TYPE_CHECKING:
    from lmspec.runtime.train.checkpoint import Checkpoints

logger = logging.getLogger(__name__)


class WrittenDigests(Protocol):
    def collect(self) -> dict[str, str]: ...


@dataclass
class Staged:
    """What a trainer's save leaves to do: megatron-core's AsyncRequest (or a DCP future's) writing this rank's
    share (None when the trainer has written everything already, as DeepSpeed's engine does) and the digests
    its writers take (None: the files are digested at the commit, read back once)."""

    request: Any = None
    digests: WrittenDigests | None = None


class SavingTrainer(Protocol):
    def save(self, directory: Path) -> Staged: ...
    def async_queue(self) -> Any: ...


class Saver:
    """This run's saves, one in flight at a time; every rank calls every method."""

    def __init__(self, ckpts: Checkpoints, trainer: SavingTrainer, asynchronous: bool) -> None:
        self.ckpts = ckpts
        self.trainer = trainer
        self.queue: Any = None
        if asynchronous:  # the trainer's: megatron-core's AsyncCallsQueue, or the DCP futures' (torchtitan)
            self.queue = trainer.async_queue()
        self.committed: Path | None = None  # the newest step this saver committed

    def save(self, step: int, state: dict[str, Any]) -> None:
        """Save step `step` with the trainer state `state` (step, consumed samples, RNG): committed before
        returning when synchronous, in the background (see `poll`) when asynchronous."""
        if self.queue is not None and self.queue.get_num_unfinalized_calls():
            self.queue.maybe_finalize_async_calls(blocking=True)
        tmp = self.ckpts.begin_save(step)
        with stop_signals_blocked():  # the writers this forks must outlive Slurm's USR1/TERM (train/signals.py)
            staged = self.trainer.save(tmp)
            written = {f"{TRAINER_STATE}/rank_{dist.get_rank()}.pt": self._write_state(tmp, state)}
            commit = partial(self._commit, step, tmp, staged, written)
            if staged.request is None:
                commit()
            elif self.queue is None:
                staged.request.add_finalize_fn(commit)  # after megatron-core's own (its metadata files)
                staged.request.execute_sync()
            else:
                staged.request.add_finalize_fn(commit)
                self.queue.schedule_async_request(staged.request)
                if dist.get_rank() == 0:
                    logger.info(f"lmspec: saving {tmp.name.removeprefix('.tmp-')} in the background")

    @staticmethod
    def _write_state(tmp: Path, state: dict[str, Any]) -> str:
        (tmp / TRAINER_STATE).mkdir(exist_ok=True)
        buffer = io.BytesIO()
        torch.save(state, buffer)
        return write_digested(tmp / TRAINER_STATE / f"rank_{dist.get_rank()}.pt", buffer.getvalue())

    def _commit(self, step: int, tmp: Path, staged: Staged, written: dict[str, str]) -> None:
        if staged.digests is not None:
            written.update(staged.digests.collect())
        self.committed = self.ckpts.commit(step, tmp, written)
        if dist.get_rank() == 0:
            logger.info(f"lmspec: saved {self.committed}")

    def poll(self) -> None:
        """Commit a background save every rank has finished writing (a collective while one is in flight)."""
        if self.queue is not None and self.queue.get_num_unfinalized_calls():
            self.queue.maybe_finalize_async_calls(blocking=False)

    def wait(self) -> None:
        """Wait for the save in flight, if any, commit it, and let the pruned steps' removal finish."""
        if self.queue is not None and self.queue.get_num_unfinalized_calls():
            self.queue.maybe_finalize_async_calls(blocking=True)
        self.ckpts.join_pruning()

    def abandon(self) -> None:
        """Stop a background write without committing it (the run is failing): `latest` stays where it is."""
        if self.queue is not None and self.queue.get_num_unfinalized_calls():
            for call in self.queue.async_calls:
                call.async_caller.close(abort=True)
            self.queue.async_calls.clear()
