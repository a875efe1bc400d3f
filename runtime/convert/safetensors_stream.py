"""Write HF safetensors shards tensor by tensor, with every header planned before the first byte.

`safetensors.torch.save_file` serialises a whole dict in memory; a converter that must
stay within twice the largest tensor cannot hold a shard. The format is simple (8-byte
little-endian header size, JSON header with dtype/shape/byte offsets, raw bytes), and
the mapping gives every name, shape and dtype up front, so the headers are written
first and each tensor's bytes are appended as it is produced, in plan order.

A tensor whose bytes already lie in files (the converter's direct path) is given as
bands of rows of those files (`write_bands`) and copied file to file through one small
buffer that stays in the CPU's L2 cache (BOUNCE_BYTES): pread, then write while the
bytes are still in cache. A row-parallel band (each row = one row of every TP chunk)
reads a window of rows of each chunk, then writes the window's row pieces in output
order with one writev. Each shard's blocks are reserved before it is written.

Measured on the 2.2 GB bench checkpoint (bench/convert_throughput.py), whose tensors
start at arbitrary file offsets, contiguous tensors only: this bounce copy 0.38-0.40 s;
copy_file_range (the in-kernel copy `cp` uses) 0.57 s, as it slows by a third when
source and destination offsets are not page-aligned alike; writes from mmap'd
sources ~0.9 s (4 s with MAP_POPULATE); a 4 MiB bounce buffer 1.3-2 s. Row-parallel
tensors (587 MB in 57k row pieces): 0.19 s this way, 0.33 s with one copy_file_range
per row piece.
"""

from __future__ import annotations

import errno
import io
import json
import logging
import os
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from lmspec.runtime.dtypes import DTYPE_BYTES, dtype_name

log = logging.getLogger(__name__)
_NO_FALLOCATE = frozenset({errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL, errno.ENOSYS})

if TYPE_CHECKING:
    import torch

DEFAULT_MAX_SHARD_BYTES = 5 * 1000**3  # what transformers' save_pretrained uses ("5GB")
INDEX_JSON = "model.safetensors.index.json"
WRITE_SLICE_BYTES = 16 << 20  # one write() of hundreds of MB is ~8x slower here than 16 MiB slices
_ST_DTYPES = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}
IOV_MAX = os.sysconf("SC_IOV_MAX")  # buffers per writev
BOUNCE_BYTES = 512 << 10  # read, then written while still in L2 (1 MiB per core here; 4 MiB ran 5x slower)


def _write_all(fd: int, buffers: Sequence[memoryview]) -> None:
    """writev every buffer, in calls of at most IOV_MAX buffers and about WRITE_SLICE_BYTES,
    resuming after short writes."""
    pieces = [b[i : i + WRITE_SLICE_BYTES] for b in buffers for i in range(0, len(b), WRITE_SLICE_BYTES)]
    i = 0
    while i < len(pieces):
        batch: list[memoryview] = []
        size = 0
        while i < len(pieces) and len(batch) < IOV_MAX and size < WRITE_SLICE_BYTES:
            batch.append(pieces[i])
            size += len(pieces[i])
            i += 1
        first = 0
        while first < len(batch):  # after a short write, resume where it stopped
            written = os.writev(fd, batch[first:])
            while first < len(batch) and written >= len(batch[first]):
                written -= len(batch[first])
                first += 1
            if first < len(batch):
                batch[first] = batch[first][written:]


class SourceRun(Protocol):
    """`nbytes` bytes at `offset` of a source file (lmspec.runtime.convert.dist_reader.ByteRun)."""

    @property
    def file(self) -> str: ...
    @property
    def offset(self) -> int: ...
    @property
    def nbytes(self) -> int: ...


class SourceBand(Protocol):
    """`rows` rows, each one row of every part in turn (lmspec.runtime.convert.dist_reader.Band)."""

    @property
    def rows(self) -> int: ...
    @property
    def parts(self) -> tuple[SourceRun, ...]: ...


def _pread_all(fd: int, into: memoryview, offset: int) -> None:
    while len(into):
        got = os.preadv(fd, [into], offset)
        if not got:
            raise EOFError(f"source file ends at {offset}, inside a tensor")
        into, offset = into[got:], offset + got


def _copy_run(dst: int, src: int, offset: int, nbytes: int, bounce: memoryview) -> None:
    for start in range(offset, offset + nbytes, len(bounce)):
        piece = bounce[: min(len(bounce), offset + nbytes - start)]
        _pread_all(src, piece, start)
        _write_all(dst, [piece])


def _copy_band(dst: int, band: SourceBand, fileno: Callable[[str], int], bounce: memoryview) -> None:
    """Append the band's rows to `dst`: a window of rows of every part read at once, then one writev
    of the window's row pieces in output order."""
    if len(band.parts) == 1:
        (part,) = band.parts
        _copy_run(dst, fileno(part.file), part.offset, part.nbytes, bounce)
        return
    widths = [part.nbytes // band.rows for part in band.parts]
    if sum(widths) > len(bounce):  # rows wider than the buffer: piece by piece
        for i in range(band.rows):
            for part, width in zip(band.parts, widths):
                _copy_run(dst, fileno(part.file), part.offset + i * width, width, bounce)
        return
    step = max(1, min(len(bounce) // sum(widths), IOV_MAX // len(band.parts)))
    for first in range(0, band.rows, step):
        rows = min(step, band.rows - first)
        starts, pos = [], 0
        for part, width in zip(band.parts, widths):
            _pread_all(fileno(part.file), bounce[pos : pos + rows * width], part.offset + first * width)
            starts.append(pos)
            pos += rows * width
        _write_all(dst, [bounce[s + i * w : s + (i + 1) * w] for i in range(rows) for s, w in zip(starts, widths)])


def _preallocate(fd: int, nbytes: int) -> None:
    """Reserve the shard's blocks before its bytes stream in: ext4 then allocates once instead of page
    by page (the 2.2 GB bench shard: 0.42 s instead of 0.58 s). Where the file system cannot (tmpfs of
    old kernels, some network file systems), writes allocate; a full disk is an error here already."""
    try:
        os.posix_fallocate(fd, 0, nbytes)
    except OSError as exc:
        if exc.errno not in _NO_FALLOCATE:
            raise
        log.debug("posix_fallocate unsupported here (%s); the shard's writes allocate its blocks", exc.strerror)


@dataclass(frozen=True)
class Planned:
    name: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def nbytes(self) -> int:
        n = DTYPE_BYTES[self.dtype]
        for d in self.shape:
            n *= d
        return n


@dataclass
class _Shard:
    file: str
    tensors: list[Planned] = field(default_factory=list)

    def header(self) -> bytes:
        offset = 0
        entries: dict[str, dict[str, Any]] = {"__metadata__": {"format": "pt"}}
        for t in self.tensors:
            entries[t.name] = {
                "dtype": _ST_DTYPES[t.dtype],
                "shape": list(t.shape),
                "data_offsets": [offset, offset + t.nbytes],
            }
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
        self._fh: io.FileIO | None = None
        self._open_shard: _Shard | None = None
        self.bytes_written = 0
        self._bounce = memoryview(bytearray(BOUNCE_BYTES))

    @property
    def total_bytes(self) -> int:
        return sum(t.nbytes for _, t in self._queue)

    def write(self, name: str, tensor: torch.Tensor) -> None:
        planned = self._next_planned(name)
        if tuple(tensor.shape) != planned.shape or dtype_name(tensor.dtype) != planned.dtype:
            raise ValueError(
                f"{name}: produced {tuple(tensor.shape)} {tensor.dtype}, the mapping says "
                f"{planned.shape} {planned.dtype}"
            )
        import torch  # loaded already: `tensor` is one

        _write_all(self._open(planned), [tensor.contiguous().reshape(-1).view(torch.uint8).numpy().data])
        self._done(planned)

    def write_bands(self, name: str, bands: Sequence[SourceBand], fileno: Callable[[str], int]) -> None:
        """Append tensor `name`, whose bytes are the bands' rows in order (`fileno`: a part's file, open)."""
        planned = self._next_planned(name)
        total = sum(part.nbytes for band in bands for part in band.parts)
        if total != planned.nbytes:
            raise ValueError(
                f"{name}: {total} bytes in the checkpoint, the mapping says {list(planned.shape)} "
                f"{planned.dtype} = {planned.nbytes} bytes"
            )
        fd = self._open(planned)
        for band in bands:
            _copy_band(fd, band, fileno, self._bounce)
        self._done(planned)

    def _next_planned(self, name: str) -> Planned:
        if self._next >= len(self._queue):
            raise ValueError(f"{name}: not in the planned tensors (all {len(self._queue)} already written)")
        planned = self._queue[self._next][1]
        if name != planned.name:
            raise ValueError(f"{name}: expected {planned.name} next in the planned order")
        return planned

    def _open(self, planned: Planned) -> int:
        """The descriptor of the shard `planned` goes to, its header written when first opened."""
        shard = self._queue[self._next][0]
        if shard is not self._open_shard:
            self._close()
            self._fh = open(self.directory / shard.file, "wb", buffering=0)  # noqa: SIM115 (big writes: no copy)
            header = shard.header()
            _preallocate(self._fh.fileno(), len(header) + sum(t.nbytes for t in shard.tensors))
            _write_all(self._fh.fileno(), [memoryview(header)])
            self._open_shard = shard
        assert self._fh is not None
        return self._fh.fileno()

    def _done(self, planned: Planned) -> None:
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
            missing = [t.name for _, t in self._queue[self._next :]]
            raise ValueError(f"{len(missing)} planned tensors never written: {', '.join(missing[:10])}")
        index = {"metadata": {"total_size": self.total_bytes}, "weight_map": {t.name: s.file for s, t in self._queue}}
        (self.directory / INDEX_JSON).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
