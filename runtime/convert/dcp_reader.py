"""The model tensors of a torch.distributed.checkpoint (DCP) directory as full tensors on the host.

The torchtitan backend's trainer saves `{"model": ..., "optimizer": ..., "lr_scheduler": ...}` with
`dcp.save` (lmspec.runtime.train.torchtitan.trainer `_state`): each FSDP2 rank writes its shards of every
DTensor into its own `__<rank>_0.distcp`, and `.metadata` holds the global shapes and where each shard lies.
DCP flattens the nested state, so a model tensor is stored as `model.<transformers' name>`
(`model.model.embed_tokens.weight`).

Everything here goes through torch's own reader: `FileSystemReader.read_metadata` lists the tensors and
`dcp.load(..., no_dist=True)` fills full-size host tensors from whatever shards were saved, in one process
without a process group (DCP reshards the saved layout into the requested one). Only the model's keys are
asked for, so the optimizer state is never read.

A damaged checkpoint is a DcpReadError whose one-line message names the file: before any read, every
shard the requested tensors need must be there and long enough for the byte ranges `.metadata` gives them
(a missing or truncated `__1_0.distcp`); a shard whose bytes torch cannot load is named as the file the
reader had open when the load failed.
"""

from __future__ import annotations

import io
import os
import warnings
from collections.abc import Generator, Iterable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.filesystem import FileSystem
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from lmspec.runtime.dtypes import dtype_name, torch_dtype

MODEL_KEY = "model"  # the trainer's container of the model state (TorchtitanTrainer._state)
METADATA = ".metadata"  # DCP's index of a checkpoint directory
_LONG = 160  # characters of an exception's message kept whole in the one-line error
_SINGLE_PROCESS_WARNING = "torch.distributed is disabled, unavailable or uninitialized"


class DcpReadError(RuntimeError):
    """The DCP checkpoint cannot be read; the message (one line) names the file."""


@dataclass(frozen=True)
class DcpTensor:
    shape: tuple[int, ...]
    dtype_name: str


def _one_line(exc: BaseException) -> str:
    """`exc` as `Type: first line`, unwrapping DCP's CheckpointException (a traceback per rank in its str)."""
    if isinstance(exc, CheckpointException) and exc.failures:
        exc = next(iter(exc.failures.values()))[0]
    lines = str(exc).strip().splitlines()
    text = lines[0] if lines else "(no message)"
    if len(text) > _LONG:  # torch's weights_only message runs on with advice about trusting the file
        text = text.split(". ")[0]
    return f"{type(exc).__name__}: {text}"


class DcpCheckpoint:
    """One DCP directory: its model tensors (names without the container's `model.`), readable in full."""

    def __init__(self, path: Path, container: str = MODEL_KEY) -> None:
        self.path = path
        self.prefix = f"{container}."
        index = path / METADATA
        if not index.is_file():
            raise DcpReadError(f"{index}: missing (not a torch.distributed.checkpoint directory)")
        try:
            self.metadata = FileSystemReader(str(path)).read_metadata()
        except Exception as exc:  # torch.load of a damaged pickle raises whatever its bytes lead to
            raise DcpReadError(f"{index}: not a DCP checkpoint index ({_one_line(exc)})") from None
        self.tensors: dict[str, DcpTensor] = {}
        self.not_tensors: list[str] = []  # bytes entries (pickled objects) under the container
        for fqn, md in self.metadata.state_dict_metadata.items():
            if not fqn.startswith(self.prefix):
                continue
            name = fqn.removeprefix(self.prefix)
            if isinstance(md, TensorStorageMetadata):
                self.tensors[name] = DcpTensor(tuple(md.size), dtype_name(md.properties.dtype))
            else:
                self.not_tensors.append(name)

    def check_files(self, names: Iterable[str]) -> None:
        """Every shard file the tensors `names` are stored in is there and holds the bytes `.metadata` places
        in it; DcpReadError naming the first file that does not."""
        wanted = {self.prefix + name for name in names}
        needed: dict[str, tuple[int, str]] = {}  # file -> (bytes it must hold, the tensor stored last in it)
        for index, info in (self.metadata.storage_data or {}).items():
            if index.fqn in wanted:
                end = info.offset + info.length
                if end > needed.get(info.relative_path, (0, ""))[0]:
                    needed[info.relative_path] = (end, index.fqn.removeprefix(self.prefix))
        for relative, (end, name) in sorted(needed.items()):
            path = self.path / relative
            try:
                size = os.stat(path).st_size
            except FileNotFoundError:
                raise DcpReadError(f"{path}: missing ({METADATA} stores shards of {name} in it)") from None
            except OSError as exc:
                raise DcpReadError(f"{path}: cannot be read: {exc.strerror}") from None
            if size < end:
                raise DcpReadError(
                    f"{path}: {size} bytes, but {METADATA} stores {name} up to byte {end} in it (a truncated shard)"
                )

    def read(self, names: Iterable[str]) -> dict[str, torch.Tensor]:
        """Full tensors `names` (model names, as `tensors` lists them) on the host, in their stored dtypes."""
        names = list(names)
        self.check_files(names)
        state = {
            name: torch.empty(self.tensors[name].shape, dtype=torch_dtype(self.tensors[name].dtype_name))
            for name in names
        }
        reader = _NamingReader(self.path)
        try:
            with warnings.catch_warnings():  # what no_dist=True asks for, which dcp.load warns of every time
                warnings.filterwarnings("ignore", message=_SINGLE_PROCESS_WARNING)
                # nested as saved: DCP flattens {"model": {name: t}} to "model.<name>", the keys .metadata holds
                dcp.load({self.prefix.removesuffix("."): state}, storage_reader=reader, no_dist=True)
        except (Exception, CheckpointException) as exc:  # CheckpointException is a BaseException
            where = reader.opened or str(self.path / METADATA)
            raise DcpReadError(f"{where}: cannot be read as part of this checkpoint ({_one_line(exc)})") from None
        return state


class _NamingFileSystem(FileSystem):
    """torch's local file system, remembering the file it opened last: the reader reads one file after the
    other, so when a load fails this is the file it was reading."""

    opened: str | None = None

    @contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Generator[io.IOBase, None, None]:
        self.opened = str(path)
        with super().create_stream(path, mode) as stream:
            yield stream


class _NamingReader(FileSystemReader):
    """torch's FileSystemReader on _NamingFileSystem."""

    def __init__(self, path: Path) -> None:
        super().__init__(str(path))
        self.fs = _NamingFileSystem()

    @property
    def opened(self) -> str | None:
        return self.fs.opened if isinstance(self.fs, _NamingFileSystem) else None
