"""Faults of the environment `lmspec run` starts in: each ends in one line naming the variable and the fix.

The variables launch/torchrun.sh and torchrun read (runtime/env_preflight.py checks them before any process
starts: exit 2, no traceback, nothing written under runs/, in bounded time), a working directory deleted
under the shell (compiler/cli/main.py), and a rank killed with SIGKILL mid-training, after which the last line
`lmspec run` prints names the rank that died first (runtime/rank_failures.py, from the records every rank
leaves: runtime/train/rank_exit.py).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from helpers.build import Compiled, compile_build
from helpers.cli import LMSPEC
from helpers.hf import save_random_hf_llama
from helpers.processes import kill_group

from lmspec.compiler.launch_names import PYTHON_ENV
from lmspec.runtime.env_preflight import RESOLVE_SECONDS

CHECKED = (PYTHON_ENV, "MASTER_PORT", "MASTER_ADDR", "NODE_RANK", "SLURM_NODEID", "TORCH_DISTRIBUTED_DEBUG")


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> Compiled:
    """The tiny default build (2 CPU ranks, one node), compiled once."""
    return compile_build(tmp_path_factory.mktemp("build"))


@pytest.fixture(scope="module")
def build(compiled: Compiled) -> Path:
    return compiled.dir


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty working directory, and an environment without the variables under test."""
    for name in CHECKED:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


ENV_CASES = [
    pytest.param({"MASTER_PORT": "abc"}, ["MASTER_PORT='abc' is not a port number", "1..65535"], id="port-word"),
    pytest.param({"MASTER_PORT": "70000"}, ["MASTER_PORT='70000' is not a port number"], id="port-too-big"),
    pytest.param(
        {"TORCH_DISTRIBUTED_DEBUG": "garbage"},
        ["TORCH_DISTRIBUTED_DEBUG='garbage' is not a level", "OFF, INFO, DETAIL"],
        id="debug-level",
    ),
    pytest.param(
        {"NODE_RANK": "1"},
        ["NODE_RANK='1' is no node of a one-node job", "unset NODE_RANK"],
        id="stray-node-rank",
    ),
    pytest.param({"SLURM_NODEID": "3"}, ["SLURM_NODEID='3' is no node of a one-node job"], id="stray-slurm-nodeid"),
    pytest.param(
        {"MASTER_ADDR": "no-such-host.invalid"},
        ["MASTER_ADDR='no-such-host.invalid' does not resolve", "node 0's address"],
        id="unresolvable-master-addr",
    ),
    pytest.param(
        {PYTHON_ENV: "/nonexistent/python3"},
        [f"{PYTHON_ENV}='/nonexistent/python3' names no executable file", "unset it to use lmspec's own"],
        id="python-missing",
    ),
    pytest.param(
        {PYTHON_ENV: "no-such-python-anywhere"},
        [f"{PYTHON_ENV}='no-such-python-anywhere' names no executable file"],
        id="python-not-on-path",
    ),
]


@pytest.mark.parametrize(("variables", "fragments"), ENV_CASES)
def test_wrong_variable_is_one_line_before_anything_starts(
    lmspec, build: Path, workdir: Path, monkeypatch: pytest.MonkeyPatch, variables: dict[str, str], fragments
) -> None:
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    started = time.monotonic()
    result = lmspec("run", str(build))
    result.assert_reports(2, fragments)
    assert len(result.err.strip().splitlines()) == 1, result.err
    assert time.monotonic() - started < RESOLVE_SECONDS + 20
    assert not (workdir / "runs").exists(), "nothing is written before the environment is checked"


def test_the_import_stage_checks_the_environment_too(
    lmspec, compiled: Compiled, workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--stage import` starts launch/torchrun.sh as training does: a wrong variable is the same one line."""
    save_random_hf_llama(compiled.plan, workdir / "hf")
    monkeypatch.setenv("MASTER_PORT", "abc")
    result = lmspec("run", str(compiled.dir), "--stage", "import", "--from", str(workdir / "hf"))
    result.assert_reports(2, ["MASTER_PORT='abc' is not a port number"])
    assert len(result.err.strip().splitlines()) == 1, result.err
    assert not (workdir / "runs").exists(), "nothing is written before the environment is checked"


def test_right_values_pass(lmspec, build: Path, workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What torchrun.sh and torch accept passes: a lower-case debug level, node 0, a numeric port, localhost."""
    for name, value in {
        "TORCH_DISTRIBUTED_DEBUG": "info",
        "NODE_RANK": "0",
        "MASTER_PORT": "29500",
        "MASTER_ADDR": "localhost",
    }.items():
        monkeypatch.setenv(name, value)
    result = lmspec("run", str(build), "--smoke")
    assert result.code == 0, result.err
    assert not (workdir / "runs").exists(), "the directory probe removes what it made"


def test_deleted_working_directory(lmspec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    for argv in (["check"], ["compile"], ["run", "build/tiny"]):
        result = lmspec(*argv)
        result.assert_reports(2, ["the working directory no longer exists", "cd to an existing directory"])
        assert len(result.err.strip().splitlines()) == 1, result.err


# ---- a rank killed mid-training ----------------------------------------------------------------


def _rank_pid(marker: str, rank: int) -> int | None:
    """The trainer process of global `rank` whose environment carries `marker` (this test's run only)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in environ and f"RANK={rank}".encode() in environ and b"lmspec.runtime.train" in cmdline:
            return int(entry.name)
    return None


@pytest.mark.slow
def test_dead_rank_ends_in_one_summary(build: Path, tmp_path: Path) -> None:
    """SIGKILL of rank 1 once training steps: rank 0 fails in gloo and torchrun prints its report (kept: it holds
    every rank's traceback), and the last line is lmspec's, naming rank 1 as the one that died first."""
    marker = f"LMSPEC_TEST_RUN={uuid.uuid4().hex}"
    env = {k: v for k, v in os.environ.items() if k not in CHECKED}
    env[marker.partition("=")[0]] = marker.partition("=")[2]
    out, err = tmp_path / "out.log", tmp_path / "err.log"
    with out.open("w") as stdout, err.open("w") as stderr:
        proc = subprocess.Popen(
            [LMSPEC, "run", str(build)], cwd=tmp_path, env=env, stdout=stdout, stderr=stderr, start_new_session=True
        )
    try:
        deadline = time.monotonic() + 180
        while "[default0]:step " not in out.read_text() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        pid = _rank_pid(marker, 1)
        assert pid is not None, f"rank 1 not found training:\n{out.read_text()}\n{err.read_text()}"
        os.kill(pid, signal.SIGKILL)
        code = proc.wait(timeout=120)
    finally:
        kill_group(proc)
    lines = err.read_text().strip().splitlines()
    assert code == 1, lines[-20:]
    assert lines[-1].startswith("lmspec run: training failed: rank 1 died first, without an error of its own"), lines[
        -20:
    ]
    assert "killed by a signal (SIGKILL" in lines[-1] and "then rank 0:" in lines[-1]
    assert "each rank's output is under runs/tiny/rank_logs/local-" in lines[-1]
