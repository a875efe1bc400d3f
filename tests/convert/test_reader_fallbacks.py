"""The converter's fast readers (inert `.metadata`, raw chunk bytes) read torch's own format, and where
they cannot, say so in one log line naming the file and the reason before torch reads it."""

from __future__ import annotations

import logging
import pickle
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from lmspec.runtime.convert.dist_metadata import METADATA_FILE, read_inert, read_metadata, read_with_torch
from lmspec.runtime.convert.dist_reader import DistCheckpoint


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    with pytest.warns(UserWarning, match="single process"):
        dcp.save({"w": torch.arange(6.0).reshape(2, 3), "b": torch.ones(3)}, checkpoint_id=str(tmp_path))
    return tmp_path


def test_torchs_own_checkpoint_takes_the_fast_paths_silently(
    checkpoint: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert read_metadata(checkpoint) == read_with_torch(checkpoint)
    ckpt = DistCheckpoint(checkpoint)
    out = torch.empty(2, 3)
    ckpt.read_into("w", ((0, 2), (0, 3)), out)
    assert torch.equal(out, torch.arange(6.0).reshape(2, 3))
    assert ckpt._raw("w", (0, 0), (2, 3)) is not None
    assert caplog.records == []


def test_an_unknown_metadata_layout_is_logged_then_read_by_torch(
    checkpoint: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (checkpoint / METADATA_FILE).write_bytes(pickle.dumps({"not": "metadata"}))
    with pytest.raises(AttributeError):  # torch's reader fails on it too, with its own error
        read_metadata(checkpoint)
    [record] = caplog.records
    assert record.levelno == logging.WARNING
    assert record.getMessage() == (
        f"{checkpoint / METADATA_FILE}: the root (dict) has no state_dict_metadata, storage_data; "
        "reading it with torch.distributed.checkpoint instead"
    )


def test_truncated_metadata_is_an_unknown_layout_not_a_crash(checkpoint: Path) -> None:
    whole = (checkpoint / METADATA_FILE).read_bytes()
    (checkpoint / METADATA_FILE).write_bytes(whole[: len(whole) // 2])
    with pytest.raises(ValueError, match="not a pickle read here"):
        read_inert(checkpoint)


def test_a_chunk_that_is_not_an_archive_is_logged_and_left_to_torch_load(
    checkpoint: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ckpt = DistCheckpoint(checkpoint)
    info = ckpt.metadata.storage["w", (0, 0)]
    with open(checkpoint / info.relative_path, "r+b") as fh:
        fh.seek(info.offset)
        fh.write(b"\0" * info.length)
    assert ckpt._raw("w", (0, 0), (2, 3)) is None
    [record] = caplog.records
    message = record.getMessage()
    assert message.startswith(f"{checkpoint / info.relative_path}: the chunk of w at [0, 0]: not a torch.save archive")
    assert message.endswith("; reading it with torch.load instead")
