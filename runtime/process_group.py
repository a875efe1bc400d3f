"""Children of `lmspec run` live in their own process group and die with it.

torchrun and vLLM both fork workers; stopping only the parent leaves orphans. The stage
runners start the child with `start_new_session=True`, turn SIGTERM into an exception
(as Ctrl-C already is), and stop the whole group on the way out.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

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
