"""Full and read-only disks, and a writer killed outright: one line naming the directory, nothing half-written.

The disks are real: a small tmpfs mounted by the test (tests/helpers/tmpfs.py; root only, skipped otherwise),
filled to its last block or remounted read-only. Cases: train.checkpoint.dir and the run directory refused
before step 1 (runtime/env_preflight.py), a checkpoint file system that fills during training (the rank's one
line, runtime/train/rank_exit.py, and lmspec run's summary naming it), `lmspec logs --plot` and `lmspec
compile` onto a full disk (compiler/build/atomic.py: the old file or none, no directory made on the way),
and `lmspec data prepare` killed with SIGKILL, whose staging directory the next prepare removes while a
live prepare's stays (runtime/data/prepare.py).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from helpers.build import compile_build
from helpers.cli import LMSPEC
from helpers.logs_report import LLAMA_FLAGS
from helpers.paths import LOG_DATA
from helpers.processes import kill_group
from helpers.tmpfs import fill, mount_tmpfs, remount_read_only
from helpers.tokenizers import builtin_documents, train_bpe_tokenizer, write_jsonl

from lmspec.runtime.data.prepare import STAGING_SUFFIX

CKPT_FS_KIB = 256  # room for the 64 KiB probe, not for one checkpoint of the tiny model (~1 MB)


@pytest.fixture(scope="module")
def ckpt_mount(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where each test mounts the file system of the build's train.checkpoint.dir (<this>/checkpoints)."""
    return tmp_path_factory.mktemp("ckpt-fs")


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory, ckpt_mount: Path) -> Path:
    """The tiny build, its checkpoints on ckpt_mount, saving every 2 steps (the first save comes soon)."""
    overrides = [f"train.checkpoint.dir={ckpt_mount}/checkpoints", "train.checkpoint.interval=2"]
    return compile_build(tmp_path_factory.mktemp("build"), overrides).dir


def _one_line(result, fragments: list[str]) -> None:
    result.assert_reports(2, fragments)
    assert len(result.err.strip().splitlines()) == 1, result.err


def test_full_checkpoint_file_system_refused_before_step_1(
    lmspec, request, build: Path, ckpt_mount: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fill(mount_tmpfs(request, ckpt_mount, CKPT_FS_KIB))
    monkeypatch.chdir(tmp_path)
    result = lmspec("run", str(build))
    _one_line(result, [f"train.checkpoint.dir='{ckpt_mount}/checkpoints' cannot be written: No space left", "free"])
    assert sorted(p.name for p in ckpt_mount.iterdir()) == ["fill"], "the probe left nothing"


def test_read_only_checkpoint_directory_refused_before_step_1(
    lmspec, request, build: Path, ckpt_mount: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    remount_read_only(mount_tmpfs(request, ckpt_mount, CKPT_FS_KIB))
    monkeypatch.chdir(tmp_path)
    result = lmspec("run", str(build))
    _one_line(result, [f"train.checkpoint.dir='{ckpt_mount}/checkpoints'", "read-only file system", "remount"])
    assert not (tmp_path / "runs" / "tiny" / "rank_logs").exists(), "no rank started"


def test_full_runs_directory_refused_before_step_1(
    lmspec, request, build: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fill(mount_tmpfs(request, tmp_path / "runs", 128))
    monkeypatch.chdir(tmp_path)
    result = lmspec("run", str(build))
    _one_line(result, ["the run directory runs/tiny", "cannot be written: No space left", "working directory"])
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["fill"]


@pytest.mark.slow
def test_checkpoint_file_system_filling_during_training(request, build: Path, ckpt_mount: Path, tmp_path: Path) -> None:
    """The probe passes, the first save does not fit: the rank ends with "no space left on DIR" (not a traceback;
    megatron's checkpoint workers may log their own error before), torchrun's report follows, and lmspec's summary
    is the last line; exit 2 as for any full disk."""
    mount_tmpfs(request, ckpt_mount, CKPT_FS_KIB)
    done = subprocess.run([LMSPEC, "run", str(build)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, lines[-20:]
    directory = f"{ckpt_mount}/checkpoints"
    assert re.match(
        rf"lmspec run: training failed: rank \d failed first \(exit code 2\): no space left on {directory}: ", lines[-1]
    ), lines[-1]
    assert "compile with train.checkpoint.dir on a larger file system" in lines[-1]
    rank = re.match(r"lmspec run: training failed: rank (\d)", lines[-1])
    assert rank is not None
    rank_logs = tmp_path / "runs" / "tiny" / "rank_logs"
    (rank_err,) = rank_logs.glob(f"local-*/*/attempt_0/{rank[1]}/stderr.log")
    rank_lines = rank_err.read_text().strip().splitlines()
    assert f"lmspec: error: no space left on {directory}: " in rank_lines[-1], "the rank ends in the line, no traceback"


def test_plot_onto_full_disk_leaves_no_part(lmspec, request, tmp_path: Path) -> None:
    """A plot that fits is written; once the disk is full, a new one fails with one line and leaves the old file
    whole (a fresh name: no file at all), and no `.part` behind."""
    disk = mount_tmpfs(request, tmp_path / "disk", 1024)
    log = str(LOG_DATA / "healthy_megatron.log")
    plot = disk / "steps.svg"
    assert lmspec("logs", log, *LLAMA_FLAGS, "--plot", str(plot)).code == 0
    before = plot.read_bytes()
    fill(disk)
    for target in (plot, disk / "other.svg"):
        _one_line(lmspec("logs", log, *LLAMA_FLAGS, "--plot", str(target)), [f"{target}", "No space left", "free"])
    assert plot.read_bytes() == before
    assert sorted(p.name for p in disk.iterdir()) == ["fill", "steps.svg"]


def test_compile_onto_full_disk_leaves_no_directory(
    lmspec, request, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    disk = mount_tmpfs(request, tmp_path / "disk", 64)
    fill(disk)
    monkeypatch.chdir(tmp_path)
    _one_line(lmspec("compile", "-o", "disk/out/build"), ["cannot write disk/out/build/tiny", "No space left"])
    assert sorted(p.name for p in disk.iterdir()) == ["fill"], "no empty output directory"


# ---- a prepare killed outright ----------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_bpe_tokenizer(tmp_path_factory.mktemp("tokenizer"))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Enough text (~2 MB) that a prepare is seen mid-write."""
    return write_jsonl(tmp_path_factory.mktemp("corpus") / "big.jsonl", builtin_documents() * 300)


def _start_prepare(corpus: Path, tokenizer: Path, prefix: Path) -> subprocess.Popen:
    argv = [LMSPEC, "data", "prepare", str(corpus), "--tokenizer", str(tokenizer), "--output", str(prefix)]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _staging(directory: Path, name: str, proc: subprocess.Popen) -> Path:
    """The staging directory of the prepare `proc` (of prefix `name`) once its .bin holds something."""
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline:
        for staging in directory.glob(f".{name}.*{STAGING_SUFFIX}"):
            if any(p.suffix == ".bin" and p.stat().st_size > 0 for p in staging.iterdir()):
                return staging
        time.sleep(0.02)
    raise AssertionError(f"no staging directory with data appeared (exit code {proc.poll()})")


def _prepare(corpus: Path, tokenizer: Path, prefix: Path) -> subprocess.CompletedProcess[str]:
    argv = [LMSPEC, "data", "prepare", str(corpus), "--tokenizer", str(tokenizer), "--output", str(prefix)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_killed_prepare_staging_reclaimed_live_one_kept(tmp_path: Path, tokenizer: Path, corpus: Path) -> None:
    """A prepare stopped mid-write (SIGSTOP: alive, holding its lock) and one killed mid-write (SIGKILL: its staging
    directory and partial .bin stay); the next prepare removes the dead one's staging, not the live one's, which
    then completes."""
    small = write_jsonl(tmp_path / "small.jsonl", builtin_documents()[:20])
    live = _start_prepare(corpus, tokenizer, tmp_path / "other")
    try:
        running = _staging(tmp_path, "other", live)
        os.kill(live.pid, signal.SIGSTOP)
        killed = _start_prepare(corpus, tokenizer, tmp_path / "ds")
        try:
            leftover = _staging(tmp_path, "ds", killed)
        finally:
            kill_group(killed)
        again = _prepare(small, tokenizer, tmp_path / "ds")
        assert again.returncode == 0, again.stderr
        assert f"removed {leftover}, left by a prepare that was killed" in again.stderr
        assert not leftover.exists() and running.is_dir(), "the dead prepare's staging went, the live one's stayed"
        assert (tmp_path / "ds.bin").is_file() and (tmp_path / "ds.idx").is_file()
        os.kill(live.pid, signal.SIGCONT)
        _, err = live.communicate(timeout=300)
        assert live.returncode == 0, err
    finally:
        kill_group(live)
    assert not list(tmp_path.glob(f".*{STAGING_SUFFIX}"))
