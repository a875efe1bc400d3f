"""Every input `lmspec data prepare` cannot use gets one clear line (file, line, option, fix) and writes nothing."""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import pytest
from helpers.tokenizers import builtin_documents, write_jsonl

GOOD = [json.dumps({"text": doc}) for doc in builtin_documents()[:3]]

# (file name, content, exit code, fragments on stderr)
BAD_INPUTS = [
    pytest.param("empty.jsonl", b"", 1, ["empty.jsonl: no documents", "leave it out of INPUT"], id="empty-file"),
    pytest.param("blank.txt", b"\n \n\n", 1, ["blank.txt: no documents"], id="only-blank-lines"),
    pytest.param(
        "data.bin", b"\x00\x01\x02\xff" * 64, 1, ["data.bin:1: not text", "NUL byte", "train.data.sources"], id="binary"
    ),
    pytest.param(
        "latin1.txt", "caf\u00e9\n".encode("latin-1"), 1, ["latin1.txt:1: not text", "invalid UTF-8"], id="invalid-utf8"
    ),
    pytest.param(
        "bad.jsonl",
        "\n".join([*GOOD, "{not json"]).encode(),
        1,
        ["bad.jsonl:4: not JSON", 'e.g. {"text": "..."}'],
        id="jsonl-not-json",
    ),
    pytest.param(
        "list.jsonl",
        "\n".join([*GOOD, '["a list"]']).encode(),
        1,
        ["list.jsonl:4: a JSON list, not an object"],
        id="jsonl-not-object",
    ),
    pytest.param(
        "key.jsonl",
        "\n".join([*GOOD, '{"id": 3, "content": "x"}']).encode(),
        1,
        ["key.jsonl:4: no 'text' key", "the line has: 'id', 'content'", "pass --text-key content"],
        id="jsonl-missing-key",
    ),
    pytest.param(
        "num.jsonl",
        b'{"text": 12}\n',
        1,
        ["num.jsonl:1: 'text' is a JSON int, not a string", "--text-key"],
        id="jsonl-non-string",
    ),
    pytest.param("docs.jsonl.gz", b"not gzip at all", 1, ["docs.jsonl.gz: not a readable gzip file"], id="bad-gzip"),
]


def assert_nothing_written(directory: Path) -> None:
    assert not directory.exists() or list(directory.iterdir()) == [], "no PREFIX.* and no staging directory"


@pytest.mark.parametrize(("name", "content", "code", "fragments"), BAD_INPUTS)
def test_bad_input_is_refused(lmspec, tmp_path: Path, tokenizer_dir: Path, name, content, code, fragments) -> None:
    source = tmp_path / name
    source.write_bytes(content)
    out = tmp_path / "out"
    result = lmspec("data", "prepare", str(source), "--tokenizer", str(tokenizer_dir), "--output", str(out / "ds"))
    result.assert_reports(code, [*fragments, "nothing was written"])
    assert_nothing_written(out)


def test_error_after_many_batches_leaves_nothing(lmspec, tmp_path: Path, tokenizer_dir: Path) -> None:
    """A bad line found late (batches already written to the staging files) still leaves no PREFIX.*."""
    source = tmp_path / "late.jsonl"
    source.write_text("\n".join(GOOD * 2000 + ['{"text": null}']) + "\n", encoding="utf-8")
    out = tmp_path / "out"
    result = lmspec(
        "data", "prepare", str(source), "--tokenizer", str(tokenizer_dir), "--output", str(out / "ds"), "--workers", "2"
    )
    result.assert_reports(1, [f"late.jsonl:{len(GOOD) * 2000 + 1}: 'text' is a JSON NoneType, not a string"])
    assert_nothing_written(out)


def test_parquet_column_errors(lmspec, tmp_path: Path, tokenizer_dir: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    cases = [
        ({"body": ["a"], "n": [1]}, ["no 'text' column (columns: 'body', 'n')", "pass --text-key body"]),
        ({"text": [1, 2]}, ["column 'text' holds int64, not strings"]),
        ({"text": ["a", None]}, ["row 2: 'text' is null"]),
    ]
    for index, (columns, fragments) in enumerate(cases):
        source = tmp_path / f"t{index}.parquet"
        pq.write_table(pa.table(columns), source)
        out = tmp_path / f"out{index}"
        result = lmspec("data", "prepare", str(source), "--tokenizer", str(tokenizer_dir), "--output", str(out / "d"))
        result.assert_reports(1, [f"t{index}.parquet", *fragments])
        assert_nothing_written(out)


def test_parquet_without_pyarrow(lmspec, tmp_path: Path, tokenizer_dir: Path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # as in an environment without pyarrow
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    source = tmp_path / "docs.parquet"
    source.write_bytes(b"PAR1")
    out = tmp_path / "out"
    result = lmspec("data", "prepare", str(source), "--tokenizer", str(tokenizer_dir), "--output", str(out / "d"))
    result.assert_reports(2, ["docs.parquet", "needs pyarrow", "pip install pyarrow"])
    assert_nothing_written(out)


def test_usage_errors(lmspec, tmp_path: Path, tokenizer_dir: Path, no_eos_tokenizer_dir: Path) -> None:
    source = write_jsonl(tmp_path / "docs.jsonl", builtin_documents()[:2])
    out = tmp_path / "out"
    prefix = str(out / "d")
    cases = [
        ([str(tmp_path / "missing.jsonl"), "--tokenizer", str(tokenizer_dir)], ["missing.jsonl", "no such file"]),
        ([str(source), "--tokenizer", str(tmp_path)], ["--tokenizer=", "tokenizer.json"]),
        (
            [str(source), "--tokenizer", str(no_eos_tokenizer_dir), "--append-eod"],
            ["--append-eod", "declares no eos token", "drop --append-eod"],
        ),
        ([str(source), "--tokenizer", str(tokenizer_dir), "--workers", "0"], ["--workers 0"]),
        ([str(source), str(tmp_path), "--tokenizer", str(tokenizer_dir)], [": a directory; give existing"]),
    ]
    for argv, fragments in cases:
        lmspec("data", "prepare", *argv, "--output", prefix).assert_reports(2, fragments)
        assert_nothing_written(out)


def test_directory_as_output_is_refused(lmspec, tmp_path: Path, tokenizer_dir: Path) -> None:
    source = write_jsonl(tmp_path / "docs.jsonl", builtin_documents()[:2])
    out = tmp_path / "out"
    out.mkdir()
    result = lmspec("data", "prepare", str(source), "--tokenizer", str(tokenizer_dir), "--output", str(out))
    result.assert_reports(2, ["--output", "is a directory; give a dataset prefix", str(out / "corpus")])
    assert_nothing_written(out)


def test_existing_output_is_refused_and_untouched(lmspec, tmp_path: Path, tokenizer_dir: Path) -> None:
    source = write_jsonl(tmp_path / "docs.jsonl", builtin_documents()[:2])
    for suffix in (".bin", ".idx", ".lmspec.json"):
        directory = tmp_path / suffix.strip(".")
        directory.mkdir()
        mine = directory / f"ds{suffix}"
        mine.write_text("the user's own file\n")
        result = lmspec(
            "data", "prepare", str(source), "--tokenizer", str(tokenizer_dir), "--output", str(directory / "ds")
        )
        result.assert_reports(2, ["--output", str(mine), "never overwrites a file", "give another prefix"])
        assert mine.read_text() == "the user's own file\n"
        assert [p.name for p in directory.iterdir()] == [mine.name]


def test_gzip_plain_text_is_not_jsonl(lmspec, tmp_path: Path, tokenizer_dir: Path) -> None:
    source = tmp_path / "notes.jsonl.gz"
    with gzip.open(source, "wt", encoding="utf-8") as out:
        out.write("plain words, not json\n")
    result = lmspec("data", "prepare", str(source), "--tokenizer", str(tokenizer_dir), "--output", str(tmp_path / "d"))
    result.assert_reports(1, ["notes.jsonl.gz:1: not JSON"])
