"""Checkpoints' commit protocol and verification, in one process (no torch.distributed)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import xxhash

from lmspec.runtime.train import digest
from lmspec.runtime.train.checkpoint import CheckpointError, Checkpoints, verify


def _save(ckpts: Checkpoints, step: int, payload: bytes = b"weights") -> Path:
    tmp = ckpts.begin_save(step)
    (tmp / "torch_dist").mkdir()
    (tmp / "torch_dist" / "__0_0.distcp").write_bytes(payload + bytes([step]))
    final = ckpts.commit(step, tmp)
    ckpts.join_pruning()  # the steps beyond keep_last_k are removed by a thread
    return final


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
    assert "step_20 is not usable" in err and "__0_0.distcp does not match its xxh3_128" in err


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


def test_files_digested_as_written_are_not_read_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """commit reads back only what no writer digested: here megatron-core's metadata, not the shard."""
    read_back: list[str] = []
    real = digest.file_digest
    monkeypatch.setattr(digest, "file_digest", lambda path, *a: read_back.append(Path(path).name) or real(path, *a))
    ckpts = Checkpoints(tmp_path / "ck", keep_last_k=1, saved_with={"backend": "megatron"})
    tmp = ckpts.begin_save(5)
    (tmp / "torch_dist").mkdir()
    shard = digest.write_digested(tmp / "torch_dist" / "__0_0.distcp", b"shard bytes")
    (tmp / "torch_dist" / "metadata.json").write_text("{}")
    step = ckpts.commit(5, tmp, {"torch_dist/__0_0.distcp": shard})
    assert read_back == ["metadata.json"]
    manifest = json.loads((step / "manifest.json").read_text())
    assert manifest["digest"] == "xxh3_128" and manifest["saved_with"] == {"backend": "megatron"}
    assert manifest["files"]["torch_dist/__0_0.distcp"] == xxhash.xxh3_128(b"shard bytes").hexdigest()
    assert verify(step) is None


def test_a_manifest_of_sha256_digests_is_still_verified(tmp_path: Path) -> None:
    """Checkpoints written before the digest was named (no "digest" key) list sha256: still resumable."""
    step = tmp_path / "ck" / "step_3"
    (step / "torch_dist").mkdir(parents=True)
    (step / "torch_dist" / "__0_0.distcp").write_bytes(b"old weights")
    files = {"torch_dist/__0_0.distcp": hashlib.sha256(b"old weights").hexdigest()}
    (step / "manifest.json").write_text(json.dumps({"step": 3, "run_id": None, "files": files}))
    (tmp_path / "ck" / "latest").write_text("step_3\n")
    assert verify(step) is None
    assert Checkpoints(tmp_path / "ck", keep_last_k=1).find_resumable() == step
    (step / "torch_dist" / "__0_0.distcp").write_bytes(b"new weights")
    assert "does not match its sha256" in verify(step)
