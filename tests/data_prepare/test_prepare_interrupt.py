"""An interrupted `lmspec data prepare` (Ctrl-C, SIGTERM) leaves no PREFIX.* file and no staging directory."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest
from helpers.cli import LMSPEC
from helpers.processes import default_sigint, kill_group
from helpers.tokenizers import builtin_documents, write_jsonl


@pytest.fixture(scope="module")
def big_jsonl(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """~40 MB: far more than a few seconds of work, so the signal lands mid-run."""
    documents = builtin_documents()
    return write_jsonl(tmp_path_factory.mktemp("big") / "big.jsonl", documents * 6000)


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupted_run_leaves_nothing(tmp_path: Path, tokenizer_dir: Path, big_jsonl: Path, signum) -> None:
    out = tmp_path / "out"
    out.mkdir()
    argv = [
        LMSPEC,
        "data",
        "prepare",
        str(big_jsonl),
        "--tokenizer",
        str(tokenizer_dir),
        "--output",
        str(out / "ds"),
        "--workers",
        "2",
    ]
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=default_sigint,
    )
    try:
        deadline = time.monotonic() + 120
        while not any(out.iterdir()) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        staging = list(out.iterdir())
        assert staging and staging[0].name.startswith(".ds."), "prepare stages in a hidden directory beside PREFIX"
        time.sleep(1.0)  # batches are being written into the staging files
        proc.send_signal(signum)  # to the parent only: it stops the workers itself
        _, err = proc.communicate(timeout=60)
    finally:
        kill_group(proc)
    assert proc.returncode == 128 + signum, err
    assert "interrupted; nothing was written" in err and "Traceback" not in err
    assert list(out.iterdir()) == []
