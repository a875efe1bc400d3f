"""Read regions of a torch_dist (torch.distributed.checkpoint) checkpoint, one stored chunk at a time.

megatron-core's dist_checkpointing writes every rank's shard of every tensor as one
chunk (`torch.save` bytes inside a `__R_S.distcp` file) and records in `.metadata`
each tensor's global shape and each chunk's offsets. Loading a whole key with
`torch.distributed.checkpoint.load` materialises its global tensor, which for a
stacked key is every layer at once; this reader copies only the chunks that overlap a
requested box, so memory stays at one output region plus one chunk.

`row_bands` goes one step further for the converter's direct path: it names the byte
ranges of the .distcp files that hold given rows of a tensor, in row order, so they can
be copied file to file without becoming tensors. That path imports no torch (the
metadata is read by runtime/convert/dist_metadata.py); reading tensors imports it when first used.
"""

from __future__ import annotations

import collections
import io
import logging
import math
import os
import pickle
import re
import struct
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from lmspec.runtime.convert.dist_metadata import StorageInfo, read_metadata
from lmspec.runtime.dtypes import DTYPE_BYTES, dtype_name, torch_dtype

if TYPE_CHECKING:
    import torch
    from _typeshed import WriteableBuffer

log = logging.getLogger(__name__)

Box = tuple[tuple[int, int], ...]
# megatron's optimizer state lives beside the model's: "optimizer.*", or "chained_<N>.optimizer.*"
# when dense and expert parameters have separate optimizers (MoE)
NON_MODEL_KEY = re.compile(r"^(chained_\d+\.)?optimizer\.")
_STORAGE_DTYPES = {"FloatStorage": "float32", "BFloat16Storage": "bfloat16", "HalfStorage": "float16"}
_ZIP_LOCAL_HEADER = struct.Struct("<IHHHHHIIIHH")  # PKZIP local file header, 30 bytes


@dataclass(frozen=True)
class _Raw:
    """Where a chunk's bytes lie in its .distcp file, when they are exactly the tensor (the fast path)."""

    file: str
    offset: int
    nbytes: int
    shape: tuple[int, ...]
    dtype: str


class ByteRun(NamedTuple):
    """`nbytes` bytes at `offset` of checkpoint file `file` (relative to the checkpoint directory)."""

    file: str
    offset: int
    nbytes: int


class Band(NamedTuple):
    """`rows` consecutive rows of a tensor, stored as one run per part: each part holds its column
    range of those rows back to back, and a row is one row of each part in turn.

    One part: a plain byte run (rows of a chunk that spans all columns). Several: a row-parallel
    tensor, whose TP chunks each hold some columns of every row.
    """

    rows: int
    parts: tuple[ByteRun, ...]


class _Recipe(pickle.Unpickler):
    """Reads a torch.save pickle of ONE plain tensor without loading data; anything else is refused."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return lambda *args: ("tensor", *args)
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        if module == "torch" and name in _STORAGE_DTYPES:
            return _STORAGE_DTYPES[name]
        raise pickle.UnpicklingError(f"{module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        return pid


class CheckpointFormatError(RuntimeError):
    """The checkpoint is not something this reader can read."""


class _Window(io.RawIOBase):
    """A read-only, seekable view of bytes [start, start + length) of an open file."""

    def __init__(self, fh: io.FileIO, start: int, length: int) -> None:
        super().__init__()
        self.fh, self.start, self.length, self.pos = fh, start, length, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self.pos, os.SEEK_END: self.length}[whence]
        self.pos = max(0, min(self.length, base + offset))
        return self.pos

    def readinto(self, buffer: WriteableBuffer) -> int:
        view = memoryview(buffer).cast("B")
        n = min(len(view), self.length - self.pos)
        if n <= 0:
            return 0
        self.fh.seek(self.start + self.pos)
        got = self.fh.readinto(view[:n])
        self.pos += got
        return got


@dataclass(frozen=True)
class StoredTensor:
    shape: tuple[int, ...]
    dtype_name: str


class DistCheckpoint:
    """The model tensors of one torch_dist directory, readable box by box."""

    def __init__(self, path: Path) -> None:
        if not (path / ".metadata").is_file():
            raise CheckpointFormatError(f"{path}: no .metadata (not a torch_dist checkpoint directory)")
        self.path = path
        self.metadata = read_metadata(path)
        self._files: dict[str, io.FileIO] = {}  # unbuffered
        self._raws: dict[tuple[str, tuple[int, ...]], _Raw | None] = {}

    def model_tensors(self) -> dict[str, StoredTensor]:
        return {
            key: StoredTensor(md.shape, md.dtype)
            for key, md in self.metadata.tensors.items()
            if not NON_MODEL_KEY.match(key)
        }

    def _file(self, relative: str) -> io.FileIO:
        if relative not in self._files:
            self._files[relative] = open(self.path / relative, "rb", buffering=0)  # noqa: SIM115
        return self._files[relative]

    def fileno(self, relative: str) -> int:
        """The OS file descriptor of checkpoint file `relative`, open for reading."""
        return self._file(relative).fileno()

    def close(self) -> None:
        for fh in self._files.values():
            fh.close()
        self._files.clear()

    def _load_chunk(self, key: str, offsets: tuple[int, ...]) -> torch.Tensor:
        import torch

        info = self.metadata.storage[key, offsets]
        if info.transforms:
            raise CheckpointFormatError(
                f"{key}: stored with transforms {list(info.transforms)} (compressed checkpoints are not supported)"
            )
        window = io.BufferedReader(
            _Window(self._file(info.relative_path), info.offset, info.length), buffer_size=1 << 16
        )
        return torch.load(window, map_location="cpu", weights_only=True)

    def _raw(self, key: str, offsets: tuple[int, ...], sizes: tuple[int, ...]) -> _Raw | None:
        """The chunk's storage bytes, if the chunk is a whole contiguous little-endian tensor stored
        uncompressed; None otherwise (then torch.load reads it). Parsed once per chunk."""
        if (key, offsets) not in self._raws:
            self._raws[key, offsets] = self._parse_raw(key, offsets, sizes)
        return self._raws[key, offsets]

    def _parse_raw(self, key: str, offsets: tuple[int, ...], sizes: tuple[int, ...]) -> _Raw | None:
        info = self.metadata.storage[key, offsets]
        if info.transforms:
            return None  # _load_chunk refuses it by name
        try:
            return _raw_in(_Window(self._file(info.relative_path), info.offset, info.length), info, sizes)
        except _NotRaw as exc:
            log.warning(
                "%s: the chunk of %s at %s: %s; reading it with torch.load instead",
                self.path / info.relative_path,
                key,
                list(offsets),
                exc,
            )
            return None

    def _read_raw(self, raw: _Raw, out: torch.Tensor) -> None:
        """Read the bytes straight into `out` (contiguous, same dtype and shape)."""
        import torch

        view = out.view(torch.uint8).numpy().data.cast("B") if out.dim() else None
        assert view is not None and len(view) == raw.nbytes
        fh = self._file(raw.file)
        fh.seek(raw.offset)
        done = 0
        while done < raw.nbytes:
            got = fh.readinto(view[done:])
            if not got:
                raise CheckpointFormatError(f"{self.path / raw.file}: ends inside a tensor")
            done += got

    def read_into(self, key: str, box: Box, out: torch.Tensor) -> None:
        """Copy region `box` (global coordinates, every dimension) of `key` into `out` (cast to its dtype).

        Every element of the box must be covered by stored chunks, else CheckpointFormatError.
        """
        import torch

        covered = 0
        for offsets, sizes in self.metadata.tensors[key].chunks:
            lo = [max(b[0], o) for b, o in zip(box, offsets)]
            hi = [min(b[1], o + s) for b, o, s in zip(box, offsets, sizes)]
            if any(a >= b for a, b in zip(lo, hi)):
                continue
            target = out[tuple(slice(a - b0[0], b - b0[0]) for a, b, b0 in zip(lo, hi, box))]
            whole = all(a == o and b == o + n for a, b, o, n in zip(lo, hi, offsets, sizes))
            raw = self._raw(key, offsets, sizes) if whole else None
            if raw is not None and target.is_contiguous() and dtype_name(target.dtype) == raw.dtype:
                self._read_raw(raw, target)  # one copy: file -> destination
            elif raw is not None:
                data = torch.empty(sizes, dtype=torch_dtype(raw.dtype))
                self._read_raw(raw, data)
                target.copy_(data)
                del data
            else:
                data = self._load_chunk(key, offsets)
                target.copy_(data[tuple(slice(a - o, b - o) for a, b, o in zip(lo, hi, offsets))])
                del data
            covered += _volume(tuple(zip(lo, hi)))
        if covered != _volume(box):
            raise CheckpointFormatError(
                f"{key}: stored chunks cover {covered} of the {_volume(box)} elements "
                f"of region {list(box)} (a partial or foreign checkpoint)"
            )

    def row_bands(self, key: str, lead: tuple[int, ...], rows: tuple[int, int], dtype: str) -> list[Band] | None:
        """Where rows [start, stop) of `key[lead]` (all later dimensions) lie in the files, in row order.

        A chunk that spans every later dimension holds its rows as one run; a 2-D chunk cut along
        columns (row-parallel) holds its columns of its rows as one run too, so a band of rows has
        one part per chunk. None when the rows cannot be copied as stored bytes (a chunk not raw
        `dtype`, another cut, incomplete coverage): the caller then reads tensors (`read_into`),
        which also reports what is wrong.
        """
        md = self.metadata.tensors[key]
        if dtype not in DTYPE_BYTES:
            return None
        d, size, item = len(lead), md.shape, DTYPE_BYTES[dtype]
        region = tuple((i, i + 1) for i in lead) + (rows,) + tuple((0, n) for n in size[d + 1 :])
        strips: list[tuple[int, int, int, str, int, int]] = []  # first row, stop row, column, file, offset, row bytes
        covered = 0
        for offsets, sizes in md.chunks:
            lo = [max(b[0], o) for b, o in zip(region, offsets)]
            hi = [min(b[1], o + n) for b, o, n in zip(region, offsets, sizes)]
            if any(a >= b for a, b in zip(lo, hi)):
                continue
            raw = self._raw(key, offsets, sizes)
            if raw is None or raw.dtype != dtype:
                return None
            if sizes[d + 1 :] != size[d + 1 :] and len(size) != d + 2:
                return None  # cut along a later dimension of a >2-D tensor: rows are not runs
            row_bytes = math.prod(sizes[d + 1 :]) * item  # the chunk's rows are contiguous: full width of the chunk
            start = sum((a - o) * math.prod(sizes[i + 1 :]) for i, (a, o) in enumerate(zip(lo, offsets))) * item
            strips.append(
                (lo[d], hi[d], lo[d + 1] if len(size) > d + 1 else 0, raw.file, raw.offset + start, row_bytes)
            )
            covered += _volume(tuple(zip(lo, hi)))
        if covered != _volume(region):
            return None
        cuts = sorted({r for first, stop, *_ in strips for r in (first, stop)})
        bands = []
        for a, b in zip(cuts, cuts[1:]):
            parts = sorted(
                (column, ByteRun(file, offset + (a - first) * width, (b - a) * width))
                for first, stop, column, file, offset, width in strips
                if first <= a < stop
            )
            bands.append(Band(b - a, tuple(run for _, run in parts)))
        return bands


class _NotRaw(Exception):
    """A chunk's `torch.save` archive is not the format the fast path reads (torch.load reads it)."""


def _raw_in(window: _Window, info: StorageInfo, sizes: tuple[int, ...]) -> _Raw | None:
    """Where the tensor's bytes lie in the chunk's archive; None for a layout that is not one contiguous
    run (a view, a cut, compressed storage: torch.load reads it, as it should); _NotRaw for an archive
    this parser does not know."""
    try:
        archive = zipfile.ZipFile(io.BufferedReader(window, buffer_size=1 << 16))
    except zipfile.BadZipFile as exc:
        raise _NotRaw(f"not a torch.save archive ({exc})") from None
    names = archive.namelist()
    prefix = names[0].split("/")[0] if names else ""
    if f"{prefix}/byteorder" in names and archive.read(f"{prefix}/byteorder") != b"little":
        return None
    if f"{prefix}/data.pkl" not in names:
        raise _NotRaw("no data.pkl in its archive")
    try:
        recipe = _Recipe(io.BytesIO(archive.read(f"{prefix}/data.pkl"))).load()
    except (pickle.UnpicklingError, EOFError) as exc:
        raise _NotRaw(f"data.pkl is not one plain tensor ({exc})") from None
    if not (isinstance(recipe, tuple) and len(recipe) >= 5 and isinstance(recipe[1], tuple) and len(recipe[1]) == 5):
        raise _NotRaw("data.pkl is not one plain tensor")
    kind, storage, offset, size, stride, *_ = recipe
    _, dtype, storage_key, _, numel = storage
    if f"{prefix}/data/{storage_key}" not in names:
        raise _NotRaw(f"no data/{storage_key} in its archive")
    member = archive.getinfo(f"{prefix}/data/{storage_key}")
    contiguous = tuple(math.prod(size[i + 1 :]) for i in range(len(size)))
    if (
        kind != "tensor"
        or offset != 0
        or tuple(size) != sizes
        or tuple(stride) != contiguous
        or numel != math.prod(size)
        or member.compress_type != zipfile.ZIP_STORED
        or member.file_size != numel * DTYPE_BYTES[dtype]
    ):
        return None
    window.seek(member.header_offset)
    header = _ZIP_LOCAL_HEADER.unpack(window.read(_ZIP_LOCAL_HEADER.size))
    start = member.header_offset + _ZIP_LOCAL_HEADER.size + header[9] + header[10]
    return _Raw(info.relative_path, info.offset + start, member.file_size, sizes, dtype)


def _volume(box: Box) -> int:
    n = 1
    for a, b in box:
        n *= b - a
    return n
