"""SIGTERM / SIGUSR1 -> finish the step, save a final checkpoint, exit for requeue.

Slurm sends `--signal=USR1@N` N seconds before the time limit, and SIGTERM on
preemption or `scancel`. The handler only sets a flag; the training loop checks
it after each step (all ranks agree through an all-reduce, since a signal may
reach ranks at different moments), saves, and exits with REQUEUE_EXIT_CODE.
The sbatch script (issue 4) runs with `--requeue` and turns this exit code into
`scontrol requeue $SLURM_JOB_ID`; any other launcher sees a non-zero exit that
means "stopped early, resumable".

Slurm signals every process of the step, helpers included. A helper a save starts by spawn (megatron-core's
dist_checkpointing keeps a spawn-context multiprocessing Manager from its first save on) runs a fresh
interpreter: exec resets the trainer's handler to the default action, and USR1's default terminates, so
the next save failed with BrokenPipeError (seen on the two-node Slurm test). Saves therefore run with the
stop signals blocked (`stop_signals_blocked`): a blocked signal stays blocked across fork and exec, so the
helpers never see one, and one that arrives during the save reaches the trainer when it ends. The
multiprocessing resource tracker is started before the signals are blocked: starting it (with the first
helper) unblocks SIGINT and SIGTERM in the calling thread, so the Manager spawned next, inside the block,
had SIGTERM deliverable again and died of torchrun's SIGTERM to the worker's group.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing import resource_tracker
from types import FrameType

import torch
import torch.distributed as dist

from lmspec.compiler.launchers import LAUNCHERS

REQUEUE_EXIT_CODE = 3
# SIGTERM always (scancel, preemption, a local `lmspec run` stopped, the rank's torchrun agent dying:
# lmspec.runtime.process_group), then each launcher's own stop
# signal (lmspec.compiler.launchers: Slurm's pre-timeout USR1), each once
HANDLED: tuple[signal.Signals, ...] = tuple(
    dict.fromkeys((signal.SIGTERM, *(launcher.stop_signal for launcher in LAUNCHERS.values())))
)


class StopRequest:
    """Set by a signal; read once per step by the training loop."""

    def __init__(self) -> None:
        self.signal_name: str | None = None

    def install(self) -> None:
        for signum in HANDLED:
            signal.signal(signum, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.signal_name = signal.Signals(signum).name

    def agreed(self) -> bool:
        """True on every rank when any rank received a stop signal."""
        flag = torch.tensor([1 if self.signal_name else 0], dtype=torch.int32)
        if dist.is_initialized():
            if dist.get_backend() == "nccl":
                flag = flag.cuda()
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())


@contextmanager
def stop_signals_blocked() -> Iterator[None]:
    """HANDLED blocked in this thread (the one that saves and starts the save's helpers), then as before."""
    resource_tracker.ensure_running()  # not inside the block, which its start would undo (module docstring)
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, HANDLED)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
