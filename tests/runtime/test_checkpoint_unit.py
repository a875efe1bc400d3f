"""Checkpoints' commit protocol and verification, in one process (no torch.distributed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lmspec.runtime.train.checkpoint import CheckpointError, Checkpoints, verify


def _save(ckpts: Checkpoints, step: int, payload: bytes = b"weights") -> Path:
    tmp = ckpts.begin_save(step)
    (tmp / "torch_dist").mkdir()
    (tmp / "torch_dist" / "__0_0.distcp").write_bytes(payload + bytes([step]))
    return ckpts.commit(step, tmp)


def test_commit_writes_manifest_latest_and_keeps_last_k(tmp_path: Path) -> None:
    ckpts = Checkpoints(tmp_path / "ck", keep_last_k=2)
    for step in (10, 20, 30):
        _save(ckpts, step)
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == ["latest", "step_20", "step_30"]
    assert (tmp_path / "ck" / "latest").read_text() == "step_30\n"
    assert verify(tmp_path / "ck" / "step_30") is None
    assert ckpts.find_resumable() == tmp_path / "ck" / "step_30"


def test_partial_save_is_ignored_and_cleaned(tmp_path: Path) -> None:
    ckpts = Checkpoints(tmp_path / "ck", keep_last_k=3)
    _save(ckpts, 10)
    tmp = ckpts.begin_save(20)  # a save that never committed (process killed)
    (tmp / "half.distcp").write_bytes(b"x")
    assert ckpts.find_resumable() == tmp_path / "ck" / "step_10"
    _save(ckpts, 20)
    assert not list((tmp_path / "ck").glob(".tmp-*"))


@pytest.mark.usefixtures("runtime_logging")
def test_corrupt_file_falls_back_with_warning(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ckpts = Checkpoints(tmp_path / "ck", keep_last_k=3)
    _save(ckpts, 10)
    newest = _save(ckpts, 20)
    (newest / "torch_dist" / "__0_0.distcp").write_bytes(b"bit rot")
    assert ckpts.find_resumable() == tmp_path / "ck" / "step_10"
    err = capsys.readouterr().err
    assert "step_20 is not usable" in err and "__0_0.distcp does not match its sha256" in err


def test_missing_file_and_missing_manifest_are_detected(tmp_path: Path) -> None:
    ckpts = Checkpoints(tmp_path / "ck", keep_last_k=3)
    step = _save(ckpts, 10)
    (step / "torch_dist" / "__0_0.distcp").unlink()
    assert "is missing" in verify(step)
    (step / "manifest.json").unlink()
    assert "the save did not finish" in verify(step)


def test_checkpoints_exist_but_none_verifies_refuses_scratch(tmp_path: Path) -> None:
    ckpts = Checkpoints(tmp_path / "ck", keep_last_k=3)
    (_save(ckpts, 10) / "manifest.json").unlink()
    with pytest.raises(CheckpointError, match="refusing to start from scratch"):
        ckpts.find_resumable()


def test_no_checkpoint_dir_means_fresh_start(tmp_path: Path) -> None:
    assert Checkpoints(tmp_path / "absent", keep_last_k=1).find_resumable() is None
