"""sha256 as lmspec records it: the hex digest of a file's bytes (manifest.json, checkpoint manifests)."""

from __future__ import annotations

import hashlib
from pathlib import Path

_CHUNK_BYTES = 1 << 20  # a checkpoint shard is hashed in pieces, never held whole


def sha256(data: bytes | str) -> str:
    """The digest of `data`; text is hashed as the UTF-8 bytes lmspec writes it as."""
    return hashlib.sha256(data.encode("utf-8") if isinstance(data, str) else data).hexdigest()


def sha256_file(path: Path) -> str:
    """The digest of the file at `path`, read in 1 MiB pieces."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(_CHUNK_BYTES), b""):
            digest.update(chunk)
    return digest.hexdigest()
