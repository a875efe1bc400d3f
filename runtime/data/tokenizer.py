"""A HuggingFace tokenizer directory, loaded offline, as data preparation and training use it.

Loaded with transformers' `PreTrainedTokenizerFast` from local files only (never the hub):
it resolves the end-of-document id from tokenizer_config.json / special_tokens_map.json as
Megatron-LM's HuggingFaceTokenizer does. Encoding goes through the underlying `tokenizers`
object's `encode_batch` with the tokenizer's own special tokens (a Llama-3 tokenizer adds its
BOS), i.e. exactly `tokenizer(text).input_ids`, which is what Megatron's preprocess_data writes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmspec.compiler.data.tokenizer_files import (
    TOKENIZER_JSON,
    TokenizerFiles,
    TokenizerFilesError,
    read_tokenizer_files,
)


class TokenizerError(ValueError):
    """A tokenizer directory that cannot be loaded; the text names the path and the fix."""


@dataclass(frozen=True)
class TextTokenizer:
    directory: Path
    files: TokenizerFiles  # tokenizer.json's sha256 and the embedding rows its ids need
    eod_id: int | None  # the eos token's id; None when the tokenizer declares none
    backend: Any  # tokenizers.Tokenizer

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self.backend.encode_batch(texts, add_special_tokens=True)]


def load_tokenizer(directory: Path, key: str = "train.data.tokenizer_path") -> TextTokenizer:
    """The tokenizer in `directory` (`key` names the setting in messages); TokenizerError if unusable."""
    try:
        files = read_tokenizer_files(directory)
    except TokenizerFilesError as exc:
        raise TokenizerError(
            f"{key}={str(directory)!r}: {exc}; give a local directory holding an HF tokenizer's "
            f"{TOKENIZER_JSON} (e.g. what `tokenizer.save_pretrained(DIR)` writes)"
        ) from None
    from transformers import PreTrainedTokenizerFast

    try:
        fast = PreTrainedTokenizerFast.from_pretrained(str(directory), local_files_only=True)
    except (OSError, ValueError) as exc:
        raise TokenizerError(f"{key}={str(directory)!r}: transformers cannot load it ({exc})") from None
    return TextTokenizer(directory=directory, files=files, eod_id=fast.eos_token_id, backend=fast.backend_tokenizer)
