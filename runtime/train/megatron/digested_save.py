"""megatron-core's distributed checkpoint save, each file digested by the process that writes it.

`dist_checkpointing.save(..., async_sharded_save=True)` stages this rank's share (the fully parallel
strategy spreads the replicated shards over the data-parallel ranks) and returns an AsyncRequest whose
`async_fn` writes it: megatron-core's FileSystemWriterAsync forks one writer process per file and
writes every item through PyTorch DCP's storage transforms (`_StorageWriterTransforms.
transform_save_stream`, the hook DCP offers to wrap the stream an item is written to). `Digests` puts
a transform in front of DCP's own that passes every byte on to the file and into an xxh3_128 hasher
(lmspec.runtime.train.digest): the file's digest is taken as it is written, never by reading it back.

The writer processes are forked twice over (the asynchronous caller, then one per file), so a digest
comes back through memory they all share: an anonymous MAP_SHARED mapping made before the request
runs, one slot per file, which each writer refreshes after every item it writes. The request is run
the same way synchronously (AsyncRequest.execute_sync) or in the background (AsyncCallsQueue).
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from lmspec.runtime.train import digest

_WRITTEN = 1  # a slot's first byte once its file has had an item written
_DIGEST_BYTES = 16  # xxh3_128
_SLOT = 1 + _DIGEST_BYTES


class _DigestingTransforms:
    """DCP's storage transforms (`inner`) over a stream that digests the file it writes into."""

    def __init__(self, inner: Any, slots: dict[str, int], table: mmap.mmap) -> None:
        self.inner = inner
        self.slots = slots
        self.table = table
        self.hashers: dict[str, digest.Hasher] = {}  # per writer process: the file it is writing

    def transform_save_stream(self, write_item: Any, raw_stream: Any) -> Any:
        name = os.fspath(raw_stream.name)
        hasher = self.hashers.setdefault(name, digest.new())
        return self.inner.transform_save_stream(write_item, _Recorded(raw_stream, hasher, self, name))

    def record(self, name: str, hasher: digest.Hasher) -> None:
        at = self.slots[name] * _SLOT
        self.table[at + 1 : at + _SLOT] = hasher.digest()
        self.table[at] = _WRITTEN


class _Recorded(digest.DigestingWriter):
    """The file stream an item is written to: its bytes digested, the digest so far recorded on flush
    (DCP flushes after each item), so the slot holds the whole file's once the last item is written."""

    def __init__(self, raw: Any, hasher: digest.Hasher, owner: _DigestingTransforms, name: str) -> None:
        super().__init__(raw, hasher)
        self.owner = owner
        self.name = name

    def flush(self) -> None:
        super().flush()
        self.owner.record(self.name, self.hasher)


@dataclass
class Digests:
    """The files one AsyncRequest writes, and their digests once it has run."""

    root: Path  # the step directory the manifest lists paths under
    paths: list[str] = field(default_factory=list)  # absolute paths, one per writer process
    table: mmap.mmap | None = None

    def wrap(self, request: Any) -> Any:
        """`request` with its writers digesting what they write (the same request when it writes nothing)."""
        if request.async_fn is None:
            return request
        write = request.async_fn  # partial(write_preloaded_data_multiproc, transform_list, use_msc)
        buckets = request.async_fn_args[1]  # megatron-core's WriteBuckets: (file path, storage key, data)
        self.paths = [os.fspath(bucket[0]) for bucket in buckets]
        self.table = mmap.mmap(-1, max(1, len(self.paths)) * _SLOT)
        slots = {path: i for i, path in enumerate(self.paths)}
        inner = write.args[0]
        if len(inner) != 1:
            raise RuntimeError(
                "megatron-core's checkpoint writer passed no storage transforms; lmspec digests files through "
                "them (torch.distributed.checkpoint's FileSystemWriter.transforms)"
            )
        transforms = [_DigestingTransforms(inner[0], slots, self.table)]
        return request._replace(async_fn=partial(write.func, transforms, *write.args[1:], **write.keywords))

    def collect(self) -> dict[str, str]:
        """{path relative to the step directory: xxh3_128}, read from the shared slots after the write."""
        found: dict[str, str] = {}
        for i, path in enumerate(self.paths):
            assert self.table is not None
            at = i * _SLOT
            if self.table[at] != _WRITTEN:
                raise RuntimeError(f"{path}: megatron-core's writer recorded no digest for it")
            found[Path(path).relative_to(self.root).as_posix()] = self.table[at + 1 : at + _SLOT].hex()
        if self.table is not None:
            self.table.close()
            self.table = None
        return found
