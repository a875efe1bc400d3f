"""An HF tokenizer and `.jsonl` corpora made offline, as a user would bring them.

The tokenizer is a small byte-level BPE trained with `tokenizers` on the corpus shipped with
lmspec and saved with transformers' `PreTrainedTokenizerFast` (tokenizer.json and
tokenizer_config.json, end-of-text as eos): nothing is downloaded.
"""

from __future__ import annotations

import json
from pathlib import Path

from lmspec.runtime.data.builtin_corpus import builtin_documents

EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"


def train_bpe_tokenizer(directory: Path, vocab_size: int = 384) -> Path:
    """A byte-level BPE of `vocab_size` ids (specials included) saved under `directory`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN, PAD_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(builtin_documents(), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=EOS_TOKEN, pad_token=PAD_TOKEN)
    fast.save_pretrained(str(directory))
    return directory


def write_jsonl(path: Path, documents: list[str], text_key: str = "text") -> Path:
    """One JSON object per line, the document under `text_key` (Megatron's preprocess_data input)."""
    with path.open("w", encoding="utf-8") as out:
        for index, doc in enumerate(documents):
            out.write(json.dumps({"id": index, text_key: doc}) + "\n")
    return path
