"""`lmspec run` (train stage) on cluster=local: exact dry-run commands, exit codes, clean stop."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.build import compile_build
from helpers.cli import LMSPEC
from helpers.processes import default_sigint

from lmspec.compiler.cli.main import run as lmspec
from lmspec.compiler.cli.run import STAGES

FAKE_TRAINER = """#!/bin/bash
# stands in for the interpreter: records its pid, then exits or sleeps as told
echo $$ > "$FAKE_PID"
[[ -n "${FAKE_SLEEP:-}" ]] && sleep "$FAKE_SLEEP"
exit "${FAKE_EXIT:-0}"
"""


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("run")
    return {
        "local": compile_build(root / "local").dir,
        "slurm": compile_build(root / "slurm", ["cluster=slurm", "name=tiny_slurm"]).dir,
    }


def _fake(tmp_path: Path) -> Path:
    fake = tmp_path / "fake-python"
    fake.write_text(FAKE_TRAINER)
    fake.chmod(0o755)
    return fake


def test_every_stage_entry_is_importable() -> None:
    for stage, target in STAGES.items():
        module, _, function = target.partition(":")
        assert importlib.util.find_spec(module) is not None, stage
        assert function


@pytest.mark.parametrize("launcher", ["local", "slurm"])
def test_dry_run_prints_the_exact_command(
    launcher: str,
    builds: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LMSPEC_PYTHON", "/opt/py thon/bin/python")
    build = builds[launcher]
    assert lmspec(["run", str(build), "--dry-run"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    script = build.resolve() / "launch" / ("torchrun.sh" if launcher == "local" else "sbatch.sh")
    runner = "bash" if launcher == "local" else "sbatch --parsable --wait"
    assert first == f"LMSPEC_PYTHON='/opt/py thon/bin/python' {runner} {script} {build.resolve()}"
    assert not (tmp_path / "runs").exists()


def test_a_container_runs_the_images_interpreter(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """This interpreter's path need not exist in the image: lmspec run names none, torchrun.sh's python3 runs."""
    monkeypatch.delenv("LMSPEC_PYTHON", raising=False)
    build = compile_build(tmp_path, ["cluster=slurm", "cluster.slurm.container.image=registry/image:1"]).dir
    assert lmspec(["run", str(build), "--dry-run"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first == f"sbatch --parsable --wait {build.resolve() / 'launch' / 'sbatch.sh'} {build.resolve()}"


def test_not_a_build_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert lmspec(["run", str(tmp_path)]) == 2
    assert "is not a build directory" in capsys.readouterr().err


def test_local_run_returns_the_trainers_exit_code(builds: dict[str, Path], tmp_path: Path) -> None:
    env = dict(os.environ, LMSPEC_PYTHON=str(_fake(tmp_path)), FAKE_PID=str(tmp_path / "pid"), FAKE_EXIT="5")
    result = subprocess.run(
        [LMSPEC, "run", str(builds["local"])],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 5, result.stderr
    assert "torchrun.sh: no checkpoint under runs/tiny/checkpoints" in result.stdout


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_stopping_lmspec_run_stops_the_whole_group(signum: int, builds: dict[str, Path], tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    env = dict(os.environ, LMSPEC_PYTHON=str(_fake(tmp_path)), FAKE_PID=str(pid_file), FAKE_SLEEP="120")
    proc = subprocess.Popen(
        [LMSPEC, "run", str(builds["local"])],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
        preexec_fn=default_sigint,
    )
    try:
        deadline = time.monotonic() + 30
        while not pid_file.exists() or not pid_file.read_text().strip():
            assert time.monotonic() < deadline and proc.poll() is None, "the trainer never started"
            time.sleep(0.05)
        trainer = int(pid_file.read_text())
        proc.send_signal(signum)  # SIGINT is what Ctrl-C delivers to lmspec
        assert proc.wait(timeout=30) == 128 + signum
        deadline = time.monotonic() + 10
        while _alive(trainer) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(trainer), "the trainer outlived lmspec run"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_smoke_checks_without_running(builds: dict[str, Path], tmp_path: Path) -> None:
    env = dict(os.environ, LMSPEC_PYTHON=sys.executable)
    result = subprocess.run(
        [LMSPEC, "run", str(builds["local"]), "--smoke"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    trainer_exists = importlib.util.find_spec("lmspec.runtime.train") is not None
    assert result.returncode == (0 if trainer_exists else 1), result.stdout + result.stderr
    assert result.stdout.count("parses (bash -n)") == 3
    assert not (tmp_path / "runs").exists()
