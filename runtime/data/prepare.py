"""Text in, a Megatron indexed dataset out: what `lmspec data prepare` does (and training, for the built-in corpus).

The files are written by megatron-core's own `IndexedDatasetBuilder` (token dtype from its
`DType.optimal_dtype`), one Megatron document per input document, so Megatron-LM reads them
unchanged. Memory stays bounded whatever the input: files stream a batch at a time and at most
two batches per worker are in flight; only the index (two ints per document) grows. Output is
atomic: everything is written in a hidden staging directory beside PREFIX and hard-linked into
place (never replacing a file) only when complete; any failure or interrupt removes the staging
directory, so no PREFIX.* file is left half-written. A prepare killed outright (kill -9) cannot remove it:
the next prepare into the same directory does, telling a dead prepare's staging from a live one's by the
flock each holds on its own.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

from lmspec.compiler.build.atomic import missing_directories, remove_empty
from lmspec.compiler.data.sidecar import DatasetSidecar, sidecar_path
from lmspec.compiler.errors import UsageError
from lmspec.runtime.data.encode import Encoded, Encoder, encode_in_workers
from lmspec.runtime.data.readers import INPUT_KINDS, is_parquet, read_batches
from lmspec.runtime.data.tokenizer import TextTokenizer

STAGING_SUFFIX = ".lmspec-staging"  # a hidden `.PREFIX.<random>` + this, beside PREFIX, while a prepare writes


def dataset_files(prefix: Path) -> tuple[Path, Path, Path]:
    """PREFIX.bin, PREFIX.idx and the sidecar: what a prepared dataset is made of."""
    return prefix.with_name(prefix.name + ".bin"), prefix.with_name(prefix.name + ".idx"), sidecar_path(prefix)


def prepare(
    inputs: list[Path],
    tokenizer: TextTokenizer,
    output: Path,
    *,
    text_key: str = "text",
    workers: int = 1,
    append_eod: bool = False,
    progress: bool = False,
) -> DatasetSidecar:
    """Tokenize `inputs` into the Megatron dataset `output` (a prefix) and its sidecar.

    UsageError for a wrong call (missing input, existing output, no eos for `append_eod`),
    DataInputError (lmspec.runtime.data.readers) for content that cannot be prepared.
    """
    _check_call(inputs, tokenizer, output, workers, append_eod)
    with warnings.catch_warnings():  # megatron.core's import warns that the GPU-only Transformer Engine/Apex are absent
        warnings.filterwarnings("ignore", message="Transformer Engine and Apex are not installed")
        from megatron.core.datasets.indexed_dataset import DType

    typecode = np.dtype(DType.optimal_dtype(tokenizer.files.vocab_size)).char  # "H" (uint16) or "i" (int32)
    encoder = Encoder(tokenizer, typecode, tokenizer.eod_id if append_eod else None)
    try:
        created = missing_directories(output.parent)
        output.parent.mkdir(parents=True, exist_ok=True)
        staging, lock = _new_staging(output)
    except OSError as exc:
        raise UsageError(f"--output {str(output)!r}: cannot write there ({exc}); give a writable prefix") from None
    try:
        documents, tokens = _write_dataset(staging / output.name, inputs, text_key, encoder, workers, progress)
        sidecar = DatasetSidecar(
            tokenizer_sha256=tokenizer.files.sha256,
            vocab_size=tokenizer.files.vocab_size,
            eod_id=encoder.eod_id,
            documents=documents,
            tokens=tokens,
        )
        sidecar_path(staging / output.name).write_text(sidecar.text(), encoding="utf-8")
        _publish(staging / output.name, output)
    except BaseException as exc:
        shutil.rmtree(staging, ignore_errors=True)
        os.close(lock)
        remove_empty(created)
        if isinstance(exc, OSError):  # the disk filled, or a file went away mid-run
            raise UsageError(f"--output {str(output)!r}: preparing failed ({exc}); nothing was written") from None
        raise
    shutil.rmtree(staging, ignore_errors=True)
    os.close(lock)
    return sidecar


def _new_staging(output: Path) -> tuple[Path, int]:
    """A staging directory beside `output` and the descriptor holding its flock, which this prepare keeps until it
    removes the directory. A process that was killed (kill -9, the OOM killer) held the lock of its own, which the
    kernel released: such leftovers, found under the parent's lock, are removed first; a live prepare's is not."""
    parent = os.open(output.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(parent, fcntl.LOCK_EX)  # no other prepare between finding a staging directory and locking it
        _reclaim_staging(output.parent)
        staging = Path(tempfile.mkdtemp(prefix=f".{output.name}.", suffix=STAGING_SUFFIX, dir=output.parent))
        lock = os.open(staging, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        fcntl.flock(lock, fcntl.LOCK_EX)
        return staging, lock
    finally:
        os.close(parent)


def _reclaim_staging(directory: Path) -> None:
    """Remove the staging directories in `directory` that no live prepare holds the lock of."""
    for candidate in directory.glob(f".*{STAGING_SUFFIX}"):
        try:
            fd = os.open(candidate, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:  # not a directory, or gone: not ours to touch
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # a prepare running now
            os.close(fd)
            continue
        try:
            shutil.rmtree(candidate)
            print(f"lmspec: removed {candidate}, left by a prepare that was killed", file=sys.stderr)
        except OSError as exc:
            print(f"lmspec: warning: cannot remove {candidate}, left by a killed prepare: {exc}", file=sys.stderr)
        finally:
            os.close(fd)


def _check_call(inputs: list[Path], tokenizer: TextTokenizer, output: Path, workers: int, append_eod: bool) -> None:
    if not inputs:
        raise UsageError(f"INPUT: no input files; give one or more {INPUT_KINDS} files")
    for path in inputs:
        if not path.is_file():
            what = "a directory" if path.is_dir() else "no such file"
            raise UsageError(f"INPUT {str(path)!r}: {what}; give existing {INPUT_KINDS} files")
        try:
            path.open("rb").close()
        except OSError as exc:
            raise UsageError(f"INPUT {str(path)!r}: cannot be read ({exc.strerror}); fix its permissions") from None
        if is_parquet(path):
            try:
                import pyarrow.parquet  # noqa: F401
            except ImportError:
                raise UsageError(
                    f"INPUT {str(path)!r}: reading parquet needs pyarrow, which is not installed; "
                    "`pip install pyarrow`, or convert the file to .jsonl"
                ) from None
    if workers < 1:
        raise UsageError(f"--workers {workers}: give a number of processes >= 1")
    if append_eod and tokenizer.eod_id is None:
        raise UsageError(
            f"--append-eod: the tokenizer in {str(tokenizer.directory)!r} declares no eos token to append; "
            "set eos_token in its tokenizer_config.json, or drop --append-eod"
        )
    if output.is_dir():
        raise UsageError(
            f"--output {str(output)!r} is a directory; give a dataset prefix, e.g. {str(output / 'corpus')!r} "
            "for corpus.bin/.idx inside it"
        )
    existing = [str(path) for path in dataset_files(output) if path.exists() or path.is_symlink()]
    if existing:
        raise UsageError(
            f"--output {str(output)!r}: {', '.join(existing)} already there, and lmspec never overwrites a file; "
            "give another prefix, or remove those files first"
        )


def _write_dataset(
    staged: Path, inputs: list[Path], text_key: str, encoder: Encoder, workers: int, progress: bool
) -> tuple[int, int]:
    """Write staged.bin/.idx with Megatron's builder; the documents and tokens written."""
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
    from tqdm import tqdm

    bin_path, idx_path, _ = dataset_files(staged)
    builder = IndexedDatasetBuilder(str(bin_path), dtype=np.dtype(encoder.typecode).type)
    bar = tqdm(unit=" docs", file=sys.stderr, disable=not progress, mininterval=0.5, dynamic_ncols=True)
    start = time.perf_counter()
    documents = tokens = 0

    def write(encoded: Encoded) -> None:
        nonlocal documents, tokens
        ids = np.frombuffer(encoded.tokens, dtype=builder.dtype)
        offset = 0
        for length in encoded.lengths:
            builder.add_document(ids[offset : offset + length], [length])
            offset += length
        documents += len(encoded.lengths)
        tokens += offset
        bar.update(len(encoded.lengths))
        bar.set_postfix_str(f"{tokens / max(time.perf_counter() - start, 1e-9):,.0f} tokens/s", refresh=False)

    batches = (batch for path in inputs for batch in read_batches(path, text_key))
    try:
        if workers == 1:
            for batch in batches:
                write(encoder(batch))
        else:
            encode_in_workers(batches, encoder, workers, write)
        builder.finalize(str(idx_path))
    finally:
        builder.data_file.close()
        bar.close()
    return documents, tokens


def _publish(staged: Path, output: Path) -> None:
    """Hard-link the staged files to PREFIX.*, all or none, never replacing a file; signals wait meanwhile."""
    blocked = {signal.SIGINT, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, blocked)
    linked: list[Path] = []
    try:
        for source, target in zip(dataset_files(staged), dataset_files(output)):
            appeared = UsageError(
                f"--output {str(output)!r}: {target} appeared while preparing, and lmspec never overwrites "
                "a file; give another prefix"
            )
            if target.exists() or target.is_symlink():
                raise appeared
            try:
                os.link(source, target)  # fails, rather than replaces, if the file appeared since
            except FileExistsError:
                raise appeared from None
            except OSError:  # a file system without hard links: checked just above, signals held
                os.rename(source, target)
            linked.append(target)
    except BaseException:
        for path in linked:
            path.unlink(missing_ok=True)
        raise
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, blocked)
