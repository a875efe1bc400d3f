"""Local launches through the emitted torchrun.sh (the trainer swapped for a gloo all-reduce): logs people can
read (the console holds global rank 0 alone, so a library's warning prints once, not once per rank; every
rank's output is in its own files, a folder per launch), and two jobs at once on one machine (each one-node
rendezvous binds a free port)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from helpers.build import compile_build
from helpers.processes import run_in_group
from helpers.swap_trainer import write_wrapper

from lmspec.compiler.build.files import TORCHRUN_SH

pytestmark = pytest.mark.slow  # 2-rank launches, ~10 s each


def test_console_has_rank_zero_and_every_rank_has_its_files(tmp_path: Path) -> None:
    build = compile_build(tmp_path / "build").dir
    out = tmp_path / "ranks"
    out.mkdir()
    env = dict(os.environ, LMSPEC_PYTHON=str(write_wrapper(tmp_path)), ALLREDUCE_OUT=str(out))
    consoles = []
    for _ in range(2):
        done = run_in_group(["bash", str(build / TORCHRUN_SH), str(build)], cwd=tmp_path, timeout_s=120, env=env)
        assert done.returncode == 0, done.stdout + done.stderr
        consoles.append(done.stdout + done.stderr)
    for console in consoles:
        assert console.count("[default0]:allreduce_worker: rank 0 of 2") == 1
        assert console.count("a library warning from rank 0") == 1
        assert "rank 1" not in console
    launches = sorted((tmp_path / "runs" / "tiny" / "rank_logs").iterdir())
    assert len(launches) == 2  # the second launch does not append to the first's files
    for launch in launches:
        stdout = sorted(launch.glob("*/attempt_0/*/stdout.log"))
        stderr = sorted(launch.glob("*/attempt_0/*/stderr.log"))
        assert [p.read_text().strip() for p in stdout] == [f"allreduce_worker: rank {r} of 2" for r in (0, 1)]
        assert [f"a library warning from rank {r}" in p.read_text() for r, p in enumerate(stderr)] == [True, True]


def test_two_jobs_at_once_on_one_machine_both_succeed(tmp_path: Path) -> None:
    """cluster.master_port=null: each one-node rendezvous binds a port of its own (port 0), so two jobs started
    together do not collide on the store."""
    env = dict(os.environ, LMSPEC_PYTHON=str(write_wrapper(tmp_path)))
    started = []
    for job in ("a", "b"):
        cwd = tmp_path / job
        out = cwd / "ranks"
        out.mkdir(parents=True)
        build = compile_build(cwd / "build", [f"name={job}"]).dir
        started.append(
            subprocess.Popen(
                ["bash", str(build / TORCHRUN_SH), str(build)],
                cwd=cwd,
                env=dict(env, ALLREDUCE_OUT=str(out)),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )
        )
    outputs = [proc.communicate(timeout=120)[0] for proc in started]
    assert [proc.returncode for proc in started] == [0, 0], outputs
    for job in ("a", "b"):
        assert len(list((tmp_path / job / "ranks").glob("rank*.json"))) == 2
