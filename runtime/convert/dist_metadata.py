"""The `.metadata` of a torch_dist checkpoint as plain data, read without importing torch.

`.metadata` is a pickle of torch.distributed.checkpoint's dataclasses (`Metadata`,
`TensorStorageMetadata`, `ChunkStorageMetadata`, `MetadataIndex`, `_StorageInfo`, ...),
torch.Size and torch dtypes. Unpickling it the usual way imports torch and
torch.distributed.checkpoint, ~1.3 s here, longer than copying a 2 GB checkpoint
(bench/convert_throughput.py), and runs whatever code the pickle names. This reader
builds inert stand-ins instead (every class becomes a `_Record` that keeps its
arguments and state; torch.Size a tuple; a dtype its name) and keeps what the
converter needs: each tensor's global shape, dtype and chunks, and where each chunk
lies. Where the pickle is not the layout this reader knows (UnknownLayout, one warning
naming the file and what differs), torch's own reader is used.
"""

from __future__ import annotations

import logging
import pickle
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmspec.runtime.dtypes import dtype_name

log = logging.getLogger(__name__)

METADATA_FILE = ".metadata"
_TORCH_DTYPE_NAMES = frozenset(
    {
        "float64",
        "float32",
        "bfloat16",
        "float16",
        "int64",
        "int32",
        "int16",
        "int8",
        "uint8",
        "bool",
        "float8_e4m3fn",
        "float8_e5m2",
    }
)
_PLAIN_GLOBALS = {("torch", "Size"): tuple, ("collections", "OrderedDict"): dict}


@dataclass(frozen=True)
class TensorMeta:
    """One stored tensor: global shape, dtype name, and its chunks as (offsets, sizes)."""

    shape: tuple[int, ...]
    dtype: str
    chunks: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]


@dataclass(frozen=True)
class StorageInfo:
    """Where one chunk's `torch.save` bytes lie: `length` bytes at `offset` of file `relative_path`."""

    relative_path: str
    offset: int
    length: int
    transforms: tuple[Any, ...]  # compression etc. (then the bytes are not the plain torch.save)


@dataclass(frozen=True)
class CheckpointMetadata:
    tensors: dict[str, TensorMeta]
    storage: dict[tuple[str, tuple[int, ...]], StorageInfo]  # (key, chunk offsets) -> where


class UnknownLayout(ValueError):
    """The `.metadata` pickle is not the layout the inert reader knows (another torch, or damaged)."""


class _Record:
    """Stands in for any class or function the pickle names: holds what it is given, runs nothing."""

    def __init__(self, *args: Any) -> None:
        self.args = args

    def __setstate__(self, state: Any) -> None:
        if isinstance(state, dict):
            self.__dict__.update(state)
        elif (
            isinstance(state, tuple)
            and len(state) == 2
            and isinstance(state[1], dict)
            and (state[0] is None or isinstance(state[0], dict))
        ):  # (dict, slots)
            self.__dict__.update(state[0] or {}, **state[1])
        else:
            self.state = state


class _Inert(pickle.Unpickler):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._classes: dict[tuple[str, str], type] = {}

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _PLAIN_GLOBALS:
            return _PLAIN_GLOBALS[module, name]
        if module == "torch" and name in _TORCH_DTYPE_NAMES:
            return name
        return self._classes.setdefault((module, name), type(name, (_Record,), {}))


def _dtype_of(properties: Any) -> str:
    dtype = getattr(properties, "dtype", None)
    state = getattr(properties, "state", None)
    if dtype is None and isinstance(state, tuple) and state:  # TensorProperties pickles its fields as a tuple
        dtype = state[0]
    if not isinstance(dtype, str):
        raise UnknownLayout(f"a tensor's dtype is {dtype!r}, not one of torch's dtypes")
    return dtype


def _needs(record: Any, what: str, *names: str) -> None:
    missing = [name for name in names if not hasattr(record, name)]
    if missing:
        raise UnknownLayout(f"{what} ({type(record).__name__}) has no {', '.join(missing)}")


def _check_layout(root: Any) -> None:
    """Every field `_collect` reads is there, with the type it reads it as; else UnknownLayout."""
    _needs(root, "the root", "state_dict_metadata", "storage_data")
    if not isinstance(root.state_dict_metadata, dict) or not isinstance(root.storage_data, dict):
        raise UnknownLayout("state_dict_metadata or storage_data is not a mapping")
    for key, md in root.state_dict_metadata.items():
        if type(md).__name__ == "TensorStorageMetadata":
            _needs(md, key, "size", "properties", "chunks")
            _dtype_of(md.properties)
            for chunk in md.chunks:
                _needs(chunk, f"a chunk of {key}", "offsets", "sizes")
    for index, info in root.storage_data.items():
        _needs(index, "a storage index", "fqn")
        _needs(info, f"the storage of {getattr(index, 'fqn', '?')}", "relative_path", "offset", "length")


def _offsets(index: Any) -> tuple[int, ...]:
    offset = getattr(index, "offset", None)  # a field left at its default is not in the pickled state
    return tuple(offset) if offset is not None else ()


def _collect(
    tensors: Iterable[tuple[str, Any]], storage: Iterable[tuple[Any, Any]], dtype_of: Callable[[Any], str]
) -> CheckpointMetadata:
    """CheckpointMetadata from `(key, TensorStorageMetadata)` and `(MetadataIndex, _StorageInfo)` pairs,
    torch's or their inert stand-ins alike."""
    return CheckpointMetadata(
        {
            key: TensorMeta(
                tuple(md.size), dtype_of(md.properties), tuple((tuple(c.offsets), tuple(c.sizes)) for c in md.chunks)
            )
            for key, md in tensors
        },
        {
            (index.fqn, _offsets(index)): StorageInfo(
                info.relative_path, info.offset, info.length, tuple(getattr(info, "transform_descriptors", None) or ())
            )
            for index, info in storage
        },
    )


def read_inert(path: Path) -> CheckpointMetadata:
    """The metadata through inert stand-ins; UnknownLayout when it is not the layout read here."""
    with open(path / METADATA_FILE, "rb") as fh:
        try:
            root = _Inert(fh).load()
        except (pickle.UnpicklingError, EOFError, ValueError) as exc:  # what pickle raises for bytes it cannot read
            raise UnknownLayout(f"not a pickle read here ({type(exc).__name__}: {exc})") from exc
    _check_layout(root)
    return _collect(
        ((key, md) for key, md in root.state_dict_metadata.items() if type(md).__name__ == "TensorStorageMetadata"),
        root.storage_data.items(),
        _dtype_of,
    )


def read_with_torch(path: Path) -> CheckpointMetadata:
    """The same, through torch's FileSystemReader (the fallback, and the reference in tests)."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    md = FileSystemReader(str(path)).read_metadata()
    return _collect(
        ((key, m) for key, m in md.state_dict_metadata.items() if isinstance(m, TensorStorageMetadata)),
        md.storage_data.items(),
        lambda properties: dtype_name(properties.dtype),
    )


def read_metadata(path: Path) -> CheckpointMetadata:
    """The checkpoint directory's metadata; torch is imported only if the inert reader cannot read it."""
    try:
        return read_inert(path)
    except UnknownLayout as exc:
        log.warning("%s: %s; reading it with torch.distributed.checkpoint instead", path / METADATA_FILE, exc)
        return read_with_torch(path)
