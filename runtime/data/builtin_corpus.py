"""The corpus shipped with lmspec (`train.data.sources: null`): runtime/train/corpus/*.txt, read as documents.

Every `.txt` there (sorted by name), split at blank lines: each non-empty paragraph is one document.
Training prepares these documents into a Megatron dataset with the spec's tokenizer
(lmspec.runtime.data.datasets), so the built-in corpus takes the same data path as the user's.
"""

from __future__ import annotations

from pathlib import Path

from lmspec.runtime.data.readers import batch_texts, read_batches

CORPUS_DIR = Path(__file__).resolve().parent.parent / "train" / "corpus"


def corpus_files() -> list[Path]:
    """The shipped `.txt` files, in order (lmspec data prepare reads plain text as blank-line documents)."""
    return sorted(CORPUS_DIR.glob("*.txt"))


def builtin_documents() -> list[str]:
    """The shipped documents as `lmspec data prepare` reads them (runtime/data/readers.py), so verify and
    the tests see exactly the documents training does."""
    return [text for path in corpus_files() for batch in read_batches(path, "text") for text in batch_texts(batch)]
