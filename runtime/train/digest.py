"""The digests a checkpoint manifest records: xxh3_128, computed as the bytes are written.

A manifest's digests exist to catch a damaged or half-written file (bit rot, a truncated copy, a save
killed part-way), not an adversary: the filesystem is the run's own. So the digest is chosen for speed
at disk rate: xxhash's xxh3_128 digests 25.8 GB/s on one core of the machine this was measured on,
sha256 1.79 GB/s and blake3 4.6 GB/s single-threaded (`bench/checkpoint_scale.py` prints them), and a
rank writing its share of a checkpoint at a few GB/s is never held up by it. Manifests written before
this (no "digest" key) list sha256 digests and are still read.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import xxhash

WRITTEN = "xxh3_128"  # what every save records now
LEGACY = "sha256"  # a manifest without a "digest" key: what lmspec recorded before
_READ_BYTES = 8 << 20  # a shard is digested in pieces, never held whole


class Hasher(Protocol):
    def update(self, data: Any, /) -> None: ...
    def hexdigest(self) -> str: ...
    def digest(self) -> bytes: ...


HASHERS: dict[str, Callable[[], Hasher]] = {WRITTEN: xxhash.xxh3_128, LEGACY: hashlib.sha256}
HEX_LENGTH = {WRITTEN: 32, LEGACY: 64}


def new(algorithm: str = WRITTEN) -> Hasher:
    return HASHERS[algorithm]()


def file_digest(path: Path, algorithm: str = WRITTEN) -> str:
    """The digest of a file read back: for a manifest written before this one's files were digested as
    written, for files a library writes out of lmspec's reach (DeepSpeed's, megatron-core's metadata),
    and for verifying on resume."""
    hasher = new(algorithm)
    with open(path, "rb", buffering=0) as fh:
        buffer = bytearray(_READ_BYTES)
        view = memoryview(buffer)
        while n := fh.readinto(buffer):
            hasher.update(view[:n])
    return hasher.hexdigest()


class DigestingWriter:
    """A write-only stream that digests what it passes on to `raw`: the file's digest without reading it back."""

    def __init__(self, raw: Any, hasher: Hasher) -> None:
        self.raw = raw
        self.hasher = hasher

    def write(self, b: Any) -> int:
        view = memoryview(b).cast("B")
        written = self.raw.write(view)
        n = len(view) if written is None else written
        self.hasher.update(view[:n])
        return n

    def flush(self) -> None:
        self.raw.flush()


def write_digested(path: Path, data: bytes) -> str:
    """Write `data` to `path` (flushed and fsynced) and return its digest, taken from the bytes in hand."""
    with open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    hasher = new()
    hasher.update(data)
    return hasher.hexdigest()
