"""What a compile reads from the machine, read in one step before the rules and the Plan.

A build is a function of the spec and of these inputs only, so `lmspec compile --check` gives the
same answer on any machine that holds the same inputs. `read_inputs` is the one place a compile
opens anything outside lmspec itself; the rules (compiler/rules/) and the emitters
(compiler/emit/) read these facts from their context or the Plan and never touch the file system
(tests/compiler/test_compile_inputs.py scans them). The machine's facts:

- every directory the run-path and data rules compare, as the runtime will open it: joined to the
  working directory, symlinks that exist now followed (compiler/run_paths.py `resolve`);
- the HF tokenizer directory's tokenizer.json (sha256 and ids), or why it cannot be read here;
- each dataset source's sidecar (PREFIX.lmspec.json), none, or why it cannot be trusted, and whether
  PREFIX.bin and PREFIX.idx are here at all;
- the earlier build's memory chart, when the target holds one still as its manifest recorded it.

Where they show in a build: the tokenizer's sha256 and ids and each sidecar's documents, tokens and
epochs (or "(no sidecar: tokens unknown)", "not readable here") in REPORT.md's data section; a source
listed twice under two spellings as a warning in REPORT.md; a kept chart as report/memory.svg itself.
The resolved directories and the tokenizer's vocabulary only ever decide an error, which stops the
compile before any file is written.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from lmspec.compiler.build.earlier import EarlierBuild
from lmspec.compiler.build.files import MEMORY_CHART
from lmspec.compiler.data.sidecar import DatasetSidecar, SidecarError, read_sidecar
from lmspec.compiler.data.tokenizer_files import TokenizerFiles, TokenizerFilesError, read_tokenizer_files
from lmspec.compiler.run_paths import compared_paths, resolve
from lmspec.compiler.spec.sections import Spec, training

T = TypeVar("T")


@dataclass(frozen=True)
class CompileInputs:
    """The machine's facts a compile depends on, keyed by the path as the spec writes it."""

    paths: dict[str, str | None] = field(default_factory=dict)  # resolved; None: cannot be a path
    tokenizers: dict[str, TokenizerFiles | TokenizerFilesError] = field(default_factory=dict)
    sidecars: dict[str, DatasetSidecar | SidecarError | None] = field(default_factory=dict)  # None: no sidecar
    datasets: dict[str, bool] = field(default_factory=dict)  # prefix -> PREFIX.bin and PREFIX.idx are files here
    earlier_chart: str | None = None  # the target's report/memory.svg, unchanged since its build wrote it

    def resolved(self, path: str | None) -> str | None:
        """`path` as the runtime opens it from the compiling directory; None for no path."""
        return _recorded(self.paths, path, "directory") if path else None

    def tokenizer(self, directory: str) -> TokenizerFiles | TokenizerFilesError:
        return _recorded(self.tokenizers, directory, "tokenizer directory")

    def sidecar(self, prefix: str) -> DatasetSidecar | SidecarError | None:
        return _recorded(self.sidecars, prefix, "dataset")

    def dataset_here(self, prefix: str) -> bool:
        return _recorded(self.datasets, prefix, "dataset")


NOTHING_READ = CompileInputs()  # a Plan read back from a build: the runtime reads the machine itself


def _recorded(table: dict[str, T], key: str, what: str) -> T:
    try:
        return table[key]
    except KeyError:
        raise LookupError(f"{what} {key!r} was not read by lmspec.compiler.inputs.read_inputs") from None


def read_inputs(spec: Spec, earlier: Path | None = None) -> CompileInputs:
    """Read what compiling `spec` depends on from this machine; `earlier` is the build directory the
    compile will replace or check (None: no chart is kept)."""
    try:
        cwd = os.getcwd()
    except OSError:  # the working directory was deleted: compare the paths as written
        cwd = "/"
    trains = training(spec)
    data = trains.train.data if trains is not None else None
    sources = [source.path for source in (data.sources or ())] if data is not None else []
    hf = data.tokenizer_path if data is not None and data.tokenizer == "hf" else None
    return CompileInputs(
        paths={path: resolve(path, cwd) for path in (*compared_paths(spec), *sources)},
        tokenizers={hf: _tokenizer(hf)} if hf is not None else {},
        sidecars={prefix: _sidecar(prefix) for prefix in sources},
        datasets={prefix: _dataset_here(prefix) for prefix in sources},
        earlier_chart=EarlierBuild(earlier).file(MEMORY_CHART) if earlier is not None else None,
    )


def _tokenizer(directory: str) -> TokenizerFiles | TokenizerFilesError:
    """The tokenizer directory as this machine holds it, or why it cannot be read here."""
    try:
        return read_tokenizer_files(Path(directory))
    except TokenizerFilesError as exc:
        return exc
    except (OSError, ValueError) as exc:  # a name too long, a NUL byte
        return TokenizerFilesError(exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc))


def _sidecar(prefix: str) -> DatasetSidecar | SidecarError | None:
    try:
        return read_sidecar(Path(prefix))
    except SidecarError as exc:
        return exc
    except (OSError, ValueError):  # a name too long, a NUL byte: no sidecar can be there
        return None


def _dataset_here(prefix: str) -> bool:
    """Whether this machine holds the Megatron dataset at `prefix`: PREFIX.bin and PREFIX.idx as files."""
    try:
        return all(Path(f"{prefix}{suffix}").is_file() for suffix in (".bin", ".idx"))
    except (OSError, ValueError):  # a name too long, a NUL byte
        return False
