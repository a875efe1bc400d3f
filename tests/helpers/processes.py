"""Run a command so that nothing it starts outlives the test.

Each command is its own session (start_new_session), so on timeout its whole process group
(torchrun workers, vLLM, srun) is SIGKILLed and the test fails with the tail of the output.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

OUTPUT_TAIL_CHARS = 3000


def default_sigint() -> None:
    """Popen's preexec_fn for a child the test stops with SIGINT: a shell's background job (`cmd &` without
    job control, as a CI runner may start pytest) ignores SIGINT, the ignore is inherited, and Python then
    installs no KeyboardInterrupt handler, so Ctrl-C would never reach the code under test."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the process group `proc` leads, then reap `proc`."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def run_in_group(
    argv: Sequence[str | Path],
    *,
    cwd: Path,
    timeout_s: float,
    env: dict[str, str] | None = None,
    merge_stderr: bool = False,
    on_timeout: Callable[[], object] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run `argv` to its end and return it (any exit code); stderr joins stdout when `merge_stderr`.

    On timeout: `on_timeout()` (e.g. cancel Slurm jobs), kill the group, fail the test.
    """
    command = [str(a) for a in argv]
    proc = subprocess.Popen(
        command,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        if on_timeout is not None:
            on_timeout()
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(
            f"timed out after {timeout_s} s: {' '.join(command)}\n"
            f"{out[-OUTPUT_TAIL_CHARS:]}\n{(err or '')[-OUTPUT_TAIL_CHARS:]}"
        )
    return subprocess.CompletedProcess(command, proc.returncode, out, err or "")
