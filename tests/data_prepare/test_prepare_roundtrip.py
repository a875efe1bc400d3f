"""What `lmspec data prepare` writes reads back through megatron-core as the tokenizer's own encoding.

Reference ids come from transformers (`tokenizer(text).input_ids`), the files are read with
megatron-core's `IndexedDataset`, one Megatron document per input document.
"""

from __future__ import annotations

import gzip
import json
import subprocess
from pathlib import Path

import pytest
from helpers.cli import LMSPEC
from helpers.tokenizers import builtin_documents, write_jsonl

DOCUMENTS = [*builtin_documents(), "caf\u00e9 na\u00efve \u2603 \u4e2d\u6587", "two lines\nof one document", "x"]


def expected_ids(tokenizer_dir: Path, documents: list[str], eod: bool) -> list[list[int]]:
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(tokenizer_dir), local_files_only=True)
    return [tokenizer(text).input_ids + ([tokenizer.eos_token_id] if eod else []) for text in documents]


def read_back(prefix: Path) -> list[list[int]]:
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    dataset = IndexedDataset(str(prefix))
    assert list(dataset.document_indices) == list(range(len(dataset) + 1)), "one sequence per document"
    return [dataset[i].tolist() for i in range(len(dataset))]


def write_input(directory: Path, kind: str, documents: list[str]) -> Path:
    if kind == "jsonl":
        return write_jsonl(directory / "docs.jsonl", documents)
    if kind == "jsonl.gz":
        path = directory / "docs.jsonl.gz"
        with gzip.open(path, "wt", encoding="utf-8") as out:
            out.writelines(json.dumps({"text": doc}) + "\n" for doc in documents)
        return path
    if kind == "parquet":
        pa = pytest.importorskip("pyarrow")
        import pyarrow.parquet as pq

        path = directory / "docs.parquet"
        pq.write_table(pa.table({"id": list(range(len(documents))), "text": documents}), path, row_group_size=5)
        return path
    path = directory / "docs.txt"  # blank lines, also several and whitespace-only, separate documents
    path.write_text("\n\n".join(documents[:3]) + "\n\n\n  \n" + "\n\n".join(documents[3:]) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize("kind", ["jsonl", "jsonl.gz", "parquet", "text"])
def test_prepared_files_are_the_tokenizers_encoding(lmspec, tmp_path: Path, tokenizer_dir: Path, kind: str) -> None:
    documents = [d for d in DOCUMENTS if "\n" not in d] if kind == "text" else DOCUMENTS
    documents = documents if kind != "text" else [*documents, "a document\nover two lines"]
    source = write_input(tmp_path, kind, documents)
    prefix = tmp_path / "new" / "dirs" / "corpus"  # missing parents are created
    result = lmspec(
        "data", "prepare", str(source), "--tokenizer", str(tokenizer_dir), "--output", str(prefix), "--append-eod"
    )
    assert result.code == 0, result.err
    ids = expected_ids(tokenizer_dir, documents, eod=True)
    assert read_back(prefix) == ids
    tokens = sum(map(len, ids))
    assert f"prepared {len(documents)} documents, {tokens:,} tokens into {prefix}" in result.out
    assert sorted(p.name for p in prefix.parent.iterdir()) == ["corpus.bin", "corpus.idx", "corpus.lmspec.json"]


def test_sidecar_records_the_tokenizer_and_counts(lmspec, tmp_path: Path, tokenizer_dir: Path) -> None:
    from lmspec.compiler.data.sidecar import read_sidecar
    from lmspec.compiler.data.tokenizer_files import read_tokenizer_files

    source = write_jsonl(tmp_path / "docs.jsonl", DOCUMENTS)
    files = read_tokenizer_files(tokenizer_dir)
    for flag, eod in (("--append-eod", 0), (None, None)):
        prefix = tmp_path / f"eod-{eod}"
        argv = ["data", "prepare", str(source), "--tokenizer", str(tokenizer_dir), "--output", str(prefix)]
        assert lmspec(*argv, *([flag] if flag else [])).code == 0
        sidecar = read_sidecar(prefix)
        assert sidecar is not None
        ids = expected_ids(tokenizer_dir, DOCUMENTS, eod=eod is not None)
        assert (sidecar.tokenizer_sha256, sidecar.vocab_size, sidecar.eod_id) == (files.sha256, files.vocab_size, eod)
        assert (sidecar.documents, sidecar.tokens) == (len(DOCUMENTS), sum(map(len, ids)))
        assert read_back(prefix) == ids


def test_text_key_and_several_inputs_in_order(lmspec, tmp_path: Path, tokenizer_dir: Path) -> None:
    first = write_jsonl(tmp_path / "a.jsonl", DOCUMENTS[:4], text_key="content")
    second = write_jsonl(tmp_path / "b.jsonl", DOCUMENTS[4:], text_key="content")
    prefix = tmp_path / "both"
    argv = ["--tokenizer", str(tokenizer_dir), "--output", str(prefix), "--text-key", "content"]
    assert lmspec("data", "prepare", str(first), str(second), *argv).code == 0
    assert read_back(prefix) == expected_ids(tokenizer_dir, DOCUMENTS, eod=False)


def test_prepare_dataset_helper_runs_the_real_prepare(tmp_path: Path, tokenizer_dir: Path) -> None:
    from helpers.datasets import prepare_dataset

    prefix = prepare_dataset(tmp_path / "made" / "ds", DOCUMENTS, tokenizer_dir)
    assert read_back(prefix) == expected_ids(tokenizer_dir, DOCUMENTS, eod=True)


@pytest.mark.slow
def test_workers_give_byte_identical_output(tmp_path: Path, tokenizer_dir: Path) -> None:
    """--workers 2 (processes, as a user runs it) writes the same bytes as --workers 1, over many batches."""
    documents = [f"{i} {doc}" for i in range(300) for doc in DOCUMENTS]  # several batches of 512 documents
    source = write_jsonl(tmp_path / "docs.jsonl", documents)
    outputs = []
    for workers in ("1", "2"):
        prefix = tmp_path / f"w{workers}"
        argv = [LMSPEC, "data", "prepare", str(source), "--tokenizer", str(tokenizer_dir), "--output", str(prefix)]
        done = subprocess.run(
            [*argv, "--workers", workers, "--append-eod"], capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stderr
        outputs.append([(prefix.parent / f"{prefix.name}{s}").read_bytes() for s in (".bin", ".idx", ".lmspec.json")])
        assert "tokens/s" in done.stderr, "the progress bar reports documents and tokens/s on stderr"
    assert outputs[0] == outputs[1]
