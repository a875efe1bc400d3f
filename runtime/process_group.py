"""Children of `lmspec run` live in their own process group and die with it.

torchrun and vLLM both fork workers; stopping only the parent leaves orphans. The stage
runners start the child with `start_new_session=True`, turn SIGTERM into an exception
(as Ctrl-C already is), and stop the whole group on the way out.

Training stops otherwise (`stop_trainers`). torchrun starts each worker in a session of its own and, on
SIGTERM, SIGTERMs each worker's whole group, helpers included (megatron-core's checkpoint writers), then
raises SignalException, whose traceback it prints; the save the trainer started on the signal then died
part-way (BrokenPipeError, a `.tmp-step_N` left). So `lmspec run` SIGKILLs the agent alone, which prints
nothing, and SIGTERMs each worker alone: the trainer finishes its step, checkpoints, and exits
(lmspec.runtime.train.signals), its helpers untouched; only what outlives the grace is SIGKILLed.

A parent's death is a stop too (`die_with_parent`, Linux's PR_SET_PDEATHSIG, kept across execve): the
torchrun agent gets SIGKILL when `lmspec run` dies however it dies (the OOM killer, a closed terminal's
SIGHUP), and every trainer gets SIGTERM when its agent dies, so it checkpoints and exits rather than
training on with nobody watching.
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

STOP_GRACE_S = 30.0  # after SIGTERM, time a trainer gets for its final checkpoint, a server to drain
EXIT_SIGINT, EXIT_SIGTERM = 128 + signal.SIGINT, 128 + signal.SIGTERM


class Terminated(Exception):
    """SIGTERM reached `lmspec run`: stop what it started, as Ctrl-C does."""


@contextmanager
def sigterm_raises() -> Iterator[None]:
    def handler(signum: int, frame: object) -> None:
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def stop_group(proc: subprocess.Popen[bytes], *, sweep: bool = False) -> None:
    """SIGTERM the child's whole group, SIGKILL after the grace; with `sweep`, also SIGKILL
    whatever the child left in its group after it exited (vLLM's engine core and workers)."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        proc.wait()
    if sweep:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(parent: int, signum: int) -> None:
    """Have the kernel send `signum` to this process when its parent `parent` dies (Linux; a no-op elsewhere).

    `parent` is the pid the caller knows as its parent: when it died before the request took effect (this
    process is already an orphan), the signal is sent at once."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")
    if os.getppid() != parent:
        os.kill(os.getpid(), signum)


def dies_with_this_process(signum: int) -> Callable[[], None]:
    """Popen's preexec_fn: the child (and what it execs) gets `signum` when this process dies."""
    parent = os.getpid()
    return lambda: die_with_parent(parent, signum)


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except ProcessLookupError:
        return None


def stop_trainers(proc: subprocess.Popen[bytes]) -> None:
    """Stop a torchrun agent (`proc`, the group leader) so that its workers checkpoint first (module docstring):
    SIGKILL the agent, SIGTERM each worker, wait up to STOP_GRACE_S for them, then SIGKILL each worker's group
    and the agent's."""
    workers = [(pid, fd) for pid in _children(proc.pid) if (fd := _pidfd(pid)) is not None]
    try:
        proc.kill()
        proc.wait()
        for _, fd in workers:
            with suppress(ProcessLookupError):  # it has ended already
                signal.pidfd_send_signal(fd, signal.SIGTERM)  # this process: a reused pid is never signalled
        deadline = time.monotonic() + STOP_GRACE_S
        for _, fd in workers:  # a pidfd is readable once its process has ended
            select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
    finally:
        for pid, fd in workers:
            os.close(fd)
            _kill_group(pid)
        _kill_group(proc.pid)


def _kill_group(pgid: int) -> None:
    with suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
