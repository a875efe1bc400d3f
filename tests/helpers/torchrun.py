"""Run `python -m lmspec.runtime.train BUILD` under torchrun, two ranks on this machine (or `nproc`).

Every run is its own process group (start_new_session) and the whole group is
SIGKILLed on timeout or when the test is done, so no worker outlives a test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers.ports import free_port
from helpers.processes import kill_group
from lmspec.compiler.build.reader import Build
from lmspec.compiler.models.lr_schedule import lr_at

RUN_TIMEOUT_S = 240
NPROC = 2


@dataclass
class Run:
    code: int
    output: str
    cwd: Path

    def metrics(self, name: str) -> list[dict]:
        path = self.cwd / "runs" / name / "metrics.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()]

    def losses(self, name: str) -> dict[int, float]:
        return {m["step"]: m["loss"] for m in self.metrics(name) if "loss" in m}

    def val_losses(self, name: str) -> dict[int, float]:
        return {m["step"]: m["val_loss"] for m in self.metrics(name) if "val_loss" in m}


def assert_rates_follow_the_schedule(build: Path, result: Run, name: str) -> None:
    """Every step's recorded learning rate is the spec's schedule's (compiler/models/lr_schedule.py's lr_at),
    whichever backend trained: both follow that one owner (tests/runtime/test_lr_schedule.py)."""
    train = Build.open(build).training().train
    rates = {m["step"]: m["lr"] for m in result.metrics(name) if "lr" in m}
    assert rates and all(rate == pytest.approx(lr_at(train, step), rel=1e-12) for step, rate in rates.items()), rates


def _command(build: Path, nproc: int = NPROC) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc-per-node={nproc}",
        "--master-addr=127.0.0.1",
        f"--master-port={free_port()}",
        "--max-restarts=0",
        "-m",
        "lmspec.runtime.train",
        str(build),
    ]


def start(build: Path, cwd: Path, log: Path, nproc: int = NPROC) -> subprocess.Popen:
    """torchrun in its own session; output to `log` (a pipe could fill and stall the workers)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    with open(log, "w") as fh:
        return subprocess.Popen(
            _command(build, nproc),
            cwd=cwd,
            env=env,
            stdout=fh,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )


def _finish(proc: subprocess.Popen, log: Path, cwd: Path, timeout_s: float) -> Run:
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        raise AssertionError(f"torchrun did not finish in time:\n{log.read_text()[-4000:]}") from None
    finally:
        kill_group(proc)  # the whole group: also any helper a worker left behind
    return Run(proc.returncode, log.read_text(), cwd)


def run(build: Path, cwd: Path, timeout_s: float = RUN_TIMEOUT_S, nproc: int = NPROC) -> Run:
    """Train `build` on `nproc` ranks to the end (or `timeout_s`)."""
    log = cwd / f"torchrun-{time.monotonic_ns()}.log"
    return _finish(start(build, cwd, log, nproc), log, cwd, timeout_s)


def workers(proc: subprocess.Popen) -> list[int]:
    """Worker pids: torchrun's children."""
    path = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
    return [int(pid) for pid in path.read_text().split()] if path.exists() else []


def run_until(
    build: Path,
    cwd: Path,
    condition: Callable[[], bool],
    action: Callable[[subprocess.Popen], None],
    timeout_s: float = RUN_TIMEOUT_S,
    poll_s: float = 0.002,
) -> Run:
    """Start a run, call `action(proc)` as soon as `condition()` holds, then wait for the end."""
    log = cwd / f"torchrun-{time.monotonic_ns()}.log"
    proc = start(build, cwd, log)
    deadline = time.monotonic() + timeout_s
    while not condition():
        if proc.poll() is not None or time.monotonic() > deadline:
            kill_group(proc)
            raise AssertionError(f"condition never held; exit {proc.returncode}:\n{log.read_text()[-4000:]}")
        time.sleep(poll_s)
    action(proc)
    return _finish(proc, log, cwd, max(1.0, deadline - time.monotonic()))


def one_node_reference(root: Path, overrides: list[str]) -> Run:
    """A tiny training of `overrides` on one node, two ranks over loopback: the losses a multi-node run of the
    same job must reproduce bitwise."""
    from helpers.build import compile_build

    result = run(compile_build(root / "build", overrides).dir, root)
    assert result.code == 0, result.output[-4000:]
    return result
