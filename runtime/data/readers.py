"""The documents of one `lmspec data prepare` input, streamed in batches, never a whole file at once.

A file's suffix says what it holds: `.jsonl` / `.jsonl.gz` (one JSON object per line, the text
under a key, as Megatron-LM's preprocess_data reads), `.parquet` (a string column, read a row
group at a time with pyarrow), anything else plain UTF-8 text whose documents are separated by
blank lines (the shipped corpus). jsonl lines travel as raw bytes and are parsed by
`batch_texts`, which the encoding workers run, so parsing is spread over them too.
"""

from __future__ import annotations

import gzip
import io
import json
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

INPUT_KINDS = ".jsonl, .jsonl.gz, .parquet or UTF-8 text (documents separated by blank lines)"
BATCH_DOCUMENTS = 512
BATCH_BYTES = 2**17
PARQUET_ROWS = 1024


class DataInputError(ValueError):
    """An input whose content cannot be prepared (exit 1); the text names the file, the line and the fix."""


@dataclass(frozen=True)
class Batch:
    """Consecutive documents of one file: raw jsonl lines (bytes) or texts (str), with their line/row numbers."""

    path: Path
    text_key: str
    numbers: list[int]  # line of each record (jsonl, text: its first line) or row (parquet), from 1
    records: list[bytes] | list[str]


def is_jsonl(path: Path) -> bool:
    return path.name.endswith((".jsonl", ".jsonl.gz"))


def is_parquet(path: Path) -> bool:
    return path.name.endswith(".parquet")


def read_batches(path: Path, text_key: str) -> Iterator[Batch]:
    """`path`'s documents in order, a batch at a time; DataInputError when the file holds none."""
    reader = _parquet_batches if is_parquet(path) else _jsonl_batches if is_jsonl(path) else _text_batches
    empty = True
    for batch in reader(path, text_key):
        empty = False
        yield batch
    if empty:
        raise DataInputError(f"{path}: no documents (the file is empty or blank); fill it or leave it out of INPUT")


def batch_texts(batch: Batch) -> list[str]:
    """The documents' texts: jsonl lines parsed and checked here; other inputs are texts already."""
    if not batch.records or isinstance(batch.records[0], str):
        return list(batch.records)  # type: ignore[arg-type]
    return [_jsonl_text(batch.path, n, line, batch.text_key) for n, line in zip(batch.numbers, batch.records)]


def _not_text(path: Path, number: int, why: str) -> DataInputError:
    return DataInputError(
        f"{path}:{number}: not text ({why}); INPUT takes {INPUT_KINDS}. A Megatron .bin/.idx pair is "
        "already prepared: give its prefix to train.data.sources instead"
    )


def _checked_line(path: Path, number: int, raw: bytes) -> str:
    if b"\0" in raw:
        raise _not_text(path, number, "a NUL byte: a binary file")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _not_text(path, number, f"invalid UTF-8 at byte {exc.start} of the line") from None


def _jsonl_text(path: Path, number: int, raw: bytes, text_key: str) -> str:
    line = _checked_line(path, number, raw)
    fix = f'each line must be one JSON object holding the document as a string, e.g. {{"{text_key}": "..."}}'
    try:
        record: Any = json.loads(line)
    except ValueError as exc:
        raise DataInputError(f"{path}:{number}: not JSON ({exc}); {fix}") from None
    if not isinstance(record, dict):
        raise DataInputError(f"{path}:{number}: a JSON {type(record).__name__}, not an object; {fix}")
    if text_key not in record:
        strings = [key for key, value in record.items() if isinstance(value, str)]
        hint = f"pass --text-key {strings[0]}" if strings else f"add a {text_key!r} string to every line"
        raise DataInputError(
            f"{path}:{number}: no {text_key!r} key (the line has: {', '.join(map(repr, record)) or 'no keys'}); {hint}"
        )
    text = record[text_key]
    if not isinstance(text, str):
        raise DataInputError(
            f"{path}:{number}: {text_key!r} is a JSON {type(text).__name__}, not a string; "
            f"store the document's text under {text_key!r}, or name the key that holds it with --text-key"
        )
    return text


def _open_lines(path: Path) -> gzip.GzipFile | io.BufferedReader:
    return gzip.open(path, "rb") if path.name.endswith(".gz") else path.open("rb")


def _jsonl_batches(path: Path, text_key: str) -> Iterator[Batch]:
    numbers: list[int] = []
    lines: list[bytes] = []
    size = 0
    try:
        with _open_lines(path) as file:
            for number, line in enumerate(file, start=1):
                if not line.strip():
                    continue
                numbers.append(number)
                lines.append(line)
                size += len(line)
                if len(lines) >= BATCH_DOCUMENTS or size >= BATCH_BYTES:
                    yield Batch(path, text_key, numbers, lines)
                    numbers, lines, size = [], [], 0
    except (gzip.BadGzipFile, EOFError, zlib.error) as exc:
        raise DataInputError(
            f"{path}: not a readable gzip file ({exc}); recompress it with `gzip`, or drop the .gz suffix "
            "if it is plain jsonl"
        ) from None
    if lines:
        yield Batch(path, text_key, numbers, lines)


def _text_batches(path: Path, text_key: str) -> Iterator[Batch]:
    """Documents separated by blank lines (whitespace only), each stripped, as the shipped corpus reads."""
    numbers: list[int] = []
    texts: list[str] = []
    size = 0
    document: list[str] = []
    start = 0
    with path.open("rb") as file:
        for number, raw in enumerate(file, start=1):
            line = _checked_line(path, number, raw)
            if line.strip():
                if not document:
                    start = number
                document.append(line)
                continue
            if document:
                text = "".join(document).strip()
                numbers.append(start)
                texts.append(text)
                size += len(text)
                document = []
                if len(texts) >= BATCH_DOCUMENTS or size >= BATCH_BYTES:
                    yield Batch(path, text_key, numbers, texts)
                    numbers, texts, size = [], [], 0
    if document:
        numbers.append(start)
        texts.append("".join(document).strip())
    if texts:
        yield Batch(path, text_key, numbers, texts)


def _parquet_batches(path: Path, text_key: str) -> Iterator[Batch]:
    import pyarrow as pa  # present: prepare() refuses parquet inputs without it, with the fix
    import pyarrow.parquet as pq

    try:
        file = pq.ParquetFile(str(path))
    except (pa.ArrowException, OSError) as exc:
        raise DataInputError(f"{path}: not a readable parquet file ({exc}); write it again with pyarrow") from None
    names = file.schema_arrow.names
    if text_key not in names:
        strings = [f.name for f in file.schema_arrow if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)]
        hint = f"pass --text-key {strings[0]}" if strings else f"add a {text_key!r} string column"
        raise DataInputError(f"{path}: no {text_key!r} column (columns: {', '.join(map(repr, names))}); {hint}")
    field = file.schema_arrow.field(text_key)
    if not (pa.types.is_string(field.type) or pa.types.is_large_string(field.type)):
        raise DataInputError(
            f"{path}: column {text_key!r} holds {field.type}, not strings; name the text column with --text-key"
        )
    row = 1
    for record_batch in file.iter_batches(batch_size=PARQUET_ROWS, columns=[text_key]):
        texts = record_batch.column(0).to_pylist()
        for offset, text in enumerate(texts):
            if text is None:
                raise DataInputError(
                    f"{path}: row {row + offset}: {text_key!r} is null; drop the row or give it a text"
                )
        yield Batch(path, text_key, list(range(row, row + len(texts))), texts)
        row += len(texts)
