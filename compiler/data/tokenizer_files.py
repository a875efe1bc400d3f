"""What a HuggingFace tokenizer directory says about itself, read without loading it.

The compiler checks a tokenizer against `model.vocab_size` and records its identity without
importing transformers: `tokenizer.json` is plain JSON. Its sha256 is the tokenizer's identity
(a prepared dataset's sidecar records it; training refuses a dataset made with another one), and
the rows it needs are one more than its largest id, added tokens included.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from lmspec.compiler.build.safe_read import Unreadable, read_regular_below, strict_json

TOKENIZER_JSON = "tokenizer.json"
TOKENIZER_JSON_LIMIT = 256 * 2**20  # the largest released tokenizer.json files are ~20 MB
MEGATRON_VOCAB_MULTIPLE = 128  # Megatron-LM's --make-vocab-size-divisible-by default


def padded_vocab_size(ids: int) -> int:
    """`ids` rounded up to a multiple of 128: the embedding rows Megatron would allocate (the rules
    propose it as model.vocab_size at compile time, the data preflight again at run time)."""
    return -(-ids // MEGATRON_VOCAB_MULTIPLE) * MEGATRON_VOCAB_MULTIPLE


class TokenizerFilesError(ValueError):
    """A tokenizer directory that cannot be used; the text reads after "<directory>: "."""


@dataclass(frozen=True)
class TokenizerFiles:
    sha256: str  # of tokenizer.json's bytes
    vocab_size: int  # embedding rows its ids need: largest id + 1


def read_tokenizer_files(directory: Path) -> TokenizerFiles:
    """`directory`'s tokenizer.json: its hash and the ids it uses (TokenizerFilesError if unusable)."""
    if not directory.is_dir():
        raise TokenizerFilesError("no such directory")
    try:
        data = read_regular_below(directory, TOKENIZER_JSON, TOKENIZER_JSON_LIMIT)
    except Unreadable as exc:
        raise TokenizerFilesError(f"{TOKENIZER_JSON}: {exc}") from None
    try:
        document = strict_json(data)
    except ValueError as exc:
        raise TokenizerFilesError(f"{TOKENIZER_JSON} is not JSON ({exc})") from None
    ids = _ids(document)
    if not ids:
        raise TokenizerFilesError(f"{TOKENIZER_JSON} holds no vocabulary (model.vocab is empty)")
    return TokenizerFiles(sha256=hashlib.sha256(data).hexdigest(), vocab_size=max(ids) + 1)


def _ids(document: object) -> list[int]:
    if not isinstance(document, dict) or not isinstance(document.get("model"), dict):
        raise TokenizerFilesError(f"{TOKENIZER_JSON} has no 'model' object: not a `tokenizers` file")
    vocab = document["model"].get("vocab")
    if isinstance(vocab, dict):  # BPE, WordPiece, WordLevel: token -> id
        ids = [v for v in vocab.values() if isinstance(v, int)]
    elif isinstance(vocab, list):  # Unigram: [token, score] rows, the id is the row
        ids = list(range(len(vocab)))
    else:
        raise TokenizerFilesError(f"{TOKENIZER_JSON}: model.vocab is neither a mapping nor a list")
    added = document.get("added_tokens") or []
    ids += [t["id"] for t in added if isinstance(t, dict) and isinstance(t.get("id"), int)]
    return ids
