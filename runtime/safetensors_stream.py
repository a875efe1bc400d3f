"""Write HF safetensors shards tensor by tensor, with every header planned before the first byte.

`safetensors.torch.save_file` serialises a whole dict in memory; a converter that must
stay within twice the largest tensor cannot hold a shard. The format is simple (8-byte
little-endian header size, JSON header with dtype/shape/byte offsets, raw bytes), and
the mapping gives every name, shape and dtype up front, so the headers are written
first and each tensor's bytes are appended as it is produced, in plan order.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

DEFAULT_MAX_SHARD_BYTES = 5 * 1000**3  # what transformers' save_pretrained uses ("5GB")
INDEX_JSON = "model.safetensors.index.json"
WRITE_SLICE_BYTES = 16 << 20  # one write() of hundreds of MB is ~8x slower here than 16 MiB slices
_ST_DTYPES = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}
_TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_ITEM_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def _write_all(fh: Any, data: memoryview) -> None:
    """An unbuffered file may write less than asked: loop until all of it is written."""
    while len(data):
        data = data[fh.write(data):]


def torch_dtype(name: str) -> torch.dtype:
    return _TORCH_DTYPES[name]


@dataclass(frozen=True)
class Planned:
    name: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def nbytes(self) -> int:
        n = _ITEM_BYTES[self.dtype]
        for d in self.shape:
            n *= d
        return n


@dataclass
class _Shard:
    file: str
    tensors: list[Planned] = field(default_factory=list)

    def header(self) -> bytes:
        offset, entries = 0, {"__metadata__": {"format": "pt"}}
        for t in self.tensors:
            entries[t.name] = {"dtype": _ST_DTYPES[t.dtype], "shape": list(t.shape),
                               "data_offsets": [offset, offset + t.nbytes]}
            offset += t.nbytes
        text = json.dumps(entries, separators=(",", ":")).encode()
        text += b" " * (-len(text) % 8)
        return struct.pack("<Q", len(text)) + text


class ShardedWriter:
    """Append tensors in the planned order; `finish()` writes the index. Checks every tensor."""

    def __init__(self, directory: Path, plan: list[Planned], max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES) -> None:
        shards: list[_Shard] = []
        size = 0
        for t in plan:
            if not shards or (size + t.nbytes > max_shard_bytes and shards[-1].tensors):
                shards.append(_Shard(""))
                size = 0
            shards[-1].tensors.append(t)
            size += t.nbytes
        for i, shard in enumerate(shards, 1):
            shard.file = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        self.directory, self.shards = directory, shards
        self._queue = [(s, t) for s in shards for t in s.tensors]
        self._next = 0
        self._fh = None
        self._open_shard: _Shard | None = None
        self.bytes_written = 0

    @property
    def total_bytes(self) -> int:
        return sum(t.nbytes for _, t in self._queue)

    def write(self, name: str, tensor: torch.Tensor) -> None:
        if self._next >= len(self._queue):
            raise ValueError(f"{name}: not in the planned tensors (all {len(self._queue)} already written)")
        shard, planned = self._queue[self._next]
        if name != planned.name:
            raise ValueError(f"{name}: expected {planned.name} next in the planned order")
        if tuple(tensor.shape) != planned.shape or tensor.dtype != _TORCH_DTYPES[planned.dtype]:
            raise ValueError(f"{name}: produced {tuple(tensor.shape)} {tensor.dtype}, the mapping says "
                             f"{planned.shape} {planned.dtype}")
        if shard is not self._open_shard:
            self._close()
            self._fh = open(self.directory / shard.file, "wb", buffering=0)  # noqa: SIM115 (big writes: no copy)
            _write_all(self._fh, memoryview(shard.header()))
            self._open_shard = shard
        raw = tensor.contiguous().reshape(-1).view(torch.uint8).numpy().data
        assert self._fh is not None
        for start in range(0, len(raw), WRITE_SLICE_BYTES):
            _write_all(self._fh, raw[start:start + WRITE_SLICE_BYTES])
        self.bytes_written += planned.nbytes
        self._next += 1

    def _close(self) -> None:
        if self._fh is not None:
            self._fh.flush()
            self._fh.close()
            self._fh = None

    def finish(self) -> None:
        self._close()
        if self._next != len(self._queue):
            missing = [t.name for _, t in self._queue[self._next:]]
            raise ValueError(f"{len(missing)} planned tensors never written: {', '.join(missing[:10])}")
        index = {"metadata": {"total_size": self.total_bytes},
                 "weight_map": {t.name: s.file for s, t in self._queue}}
        (self.directory / INDEX_JSON).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
