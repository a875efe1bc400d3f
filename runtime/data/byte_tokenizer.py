"""The byte tokenizer (`train.data.tokenizer=byte`): its ids, and the same ids as HuggingFace tokenizer files.

Byte b -> id b, end-of-text 256, pad 257 (the model's vocabulary is larger, padded; the extra rows
are never seen). Training writes it with `save_byte_tokenizer` into the run directory and reads the
built-in corpus through it like any HF tokenizer; vLLM and transformers serve with the same files.
It is a byte-level BPE with no merges, so every byte is one token and decoding gives the bytes back.
Built offline with the `tokenizers` library: nothing is downloaded.
"""

from __future__ import annotations

from pathlib import Path

BYTE_VOCAB = 256
EOT_ID = 256
PAD_ID = 257
EOT_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def encode(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def decode(ids: list[int]) -> str:
    return bytes(i for i in ids if i < BYTE_VOCAB).decode("utf-8", errors="replace")


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's printable stand-in character for each byte (what ByteLevel pre-tokenization emits)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = {b: chr(b) for b in printable}
    extra = 0
    for b in range(BYTE_VOCAB):
        if b not in chars:
            chars[b] = chr(BYTE_VOCAB + extra)
            extra += 1
    return chars


def has_tokenizer(directory: Path) -> bool:
    return any((directory / name).is_file() for name in TOKENIZER_FILES)


def save_byte_tokenizer(directory: Path) -> None:
    """Write tokenizer.json and tokenizer_config.json for the byte tokenizer into `directory`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {char: byte for byte, char in _bytes_to_unicode().items()}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=EOT_TOKEN, pad_token=PAD_TOKEN)
    ids = fast.convert_tokens_to_ids([EOT_TOKEN, PAD_TOKEN])
    if ids != [EOT_ID, PAD_ID]:
        raise RuntimeError(f"byte tokenizer special ids {ids} != {[EOT_ID, PAD_ID]}")
    fast.save_pretrained(str(directory))
