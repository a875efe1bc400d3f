"""The HF tokenizer files written for serving give exactly the training byte tokenizer's ids."""

from __future__ import annotations

from pathlib import Path

from lmspec.runtime.data.byte_tokenizer import EOT_ID, PAD_ID, decode, encode, has_tokenizer, save_byte_tokenizer

TEXTS = ["Hello, world!", "  leading spaces\nand\ttabs", "Grüße, 東京 🚀", "".join(map(chr, range(1, 128)))]


def test_saved_tokenizer_matches_the_training_ids(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    assert not has_tokenizer(tmp_path)
    save_byte_tokenizer(tmp_path)
    assert has_tokenizer(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(str(tmp_path))
    for text in TEXTS:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert ids == encode(text), text
        assert tokenizer.decode(ids) == decode(ids) == text
    assert (tokenizer.eos_token_id, tokenizer.pad_token_id) == (EOT_ID, PAD_ID)
    assert tokenizer.decode([*encode("ab"), EOT_ID], skip_special_tokens=True) == "ab"
