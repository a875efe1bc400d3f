"""Megatron datasets made the way a user makes them: documents to .jsonl, then the real `lmspec data prepare`."""

from __future__ import annotations

from pathlib import Path

from helpers.tokenizers import write_jsonl


def prepare_dataset(prefix: Path, documents: list[str], tokenizer_dir: Path, append_eod: bool = True) -> Path:
    """`documents` prepared into the dataset `prefix` (PREFIX.bin/.idx and its sidecar); returns `prefix`."""
    from lmspec.runtime.data.prepare import prepare
    from lmspec.runtime.data.tokenizer import load_tokenizer

    prefix.parent.mkdir(parents=True, exist_ok=True)
    source = write_jsonl(prefix.with_name(prefix.name + "-documents.jsonl"), documents)
    prepare([source], load_tokenizer(tokenizer_dir), prefix, append_eod=append_eod)
    return prefix
