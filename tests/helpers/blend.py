"""A user's own data for a training test: an offline BPE tokenizer and two datasets blended 0.7/0.3."""

from __future__ import annotations

from pathlib import Path

from helpers.datasets import prepare_dataset
from helpers.tokenizers import builtin_documents, train_bpe_tokenizer

WEIGHTS = (0.7, 0.3)


def blend_overrides(root: Path) -> list[str]:
    """Spec overrides training on two datasets of different documents (the shipped paragraphs, alternate
    ones in each) through an HF tokenizer; split 80,20,0 so each small dataset has valid documents."""
    tokenizer = train_bpe_tokenizer(root / "tokenizer")
    documents = builtin_documents()
    a = prepare_dataset(root / "data" / "even", documents[0::2], tokenizer)
    b = prepare_dataset(root / "data" / "odd", documents[1::2], tokenizer)
    sources = ",".join(f"{{path:{p},weight:{w}}}" for p, w in zip((a, b), WEIGHTS, strict=True))
    return [
        "train.data.tokenizer=hf",
        f"train.data.tokenizer_path={tokenizer}",
        f"train.data.sources=[{sources}]",
        'train.data.split="80,20,0"',
    ]
