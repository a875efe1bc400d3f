"""A reproducible, DP-sharded, resumable token stream from a text corpus.

Tokenizer: byte-level, built offline (ids 0-255 are bytes, then end-of-text and
pad); the model's vocabulary is larger (padded), the extra rows are never seen.
Stream: the corpus' paragraphs, each followed by end-of-text, concatenated; split
into `seq_length + 1` windows whose order is a seeded permutation per epoch.
Sample `i` of the global stream is a pure function of (corpus, seed, i), so the
position saved in a checkpoint is just `consumed_samples`, and the stream is the
same for any data-parallel degree: step s, micro-batch m, DP rank r takes global
samples s*G + m*(mb*dp) + r*mb ... + mb - 1 (G = global batch).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import torch

BYTE_VOCAB = 256
EOT_ID = 256
PAD_ID = 257
TOKENIZER_VOCAB = 258
CORPUS_DIR = Path(__file__).parent / "corpus"


def encode(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def decode(ids: list[int]) -> str:
    return bytes(i for i in ids if i < BYTE_VOCAB).decode("utf-8", errors="replace")


def corpus_text(corpus: str) -> str:
    """`builtin` = every .txt shipped in runtime/corpus (sorted); otherwise a UTF-8 file path."""
    if corpus == "builtin":
        return "\n\n".join(p.read_text(encoding="utf-8") for p in sorted(CORPUS_DIR.glob("*.txt")))
    path = Path(corpus)
    if not path.is_file():
        raise FileNotFoundError(
            f"train.data.corpus={corpus!r}: no such file; use 'builtin' or a path to a UTF-8 text file"
        )
    return path.read_text(encoding="utf-8")


def tokenize_corpus(text: str) -> torch.Tensor:
    ids: list[int] = []
    for paragraph in (p.strip() for p in text.split("\n\n")):
        if paragraph:
            ids += encode(paragraph) + [EOT_ID]
    return torch.tensor(ids, dtype=torch.long)


@dataclass(frozen=True)
class Batch:
    tokens: torch.Tensor  # [micro, seq] input ids
    labels: torch.Tensor  # [micro, seq] next-token ids


class TokenStream:
    """Global samples by index; `micro_batches(step)` gives this DP rank's share of a step."""

    def __init__(self, corpus: str, seq_length: int, seed: int, vocab_size: int) -> None:
        if vocab_size < TOKENIZER_VOCAB:
            raise ValueError(f"model.vocab_size={vocab_size} is below the byte tokenizer's {TOKENIZER_VOCAB} ids")
        self.tokens = tokenize_corpus(corpus_text(corpus))
        self.seq_length = seq_length
        self.seed = seed
        window = seq_length + 1
        if len(self.tokens) < window:
            raise ValueError(f"train.data.corpus has {len(self.tokens)} tokens, fewer than train.seq_length+1={window}")
        self.windows_per_epoch = len(self.tokens) // seq_length
        self._orders: dict[int, list[int]] = {}

    def _order(self, epoch: int) -> list[int]:
        if epoch not in self._orders:
            order = list(range(self.windows_per_epoch))
            random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
            self._orders = {epoch: order}
        return self._orders[epoch]

    def sample(self, index: int) -> torch.Tensor:
        """Global sample `index`: seq_length + 1 tokens (wrapping around the corpus end)."""
        epoch, slot = divmod(index, self.windows_per_epoch)
        start = self._order(epoch)[slot] * self.seq_length
        positions = torch.arange(start, start + self.seq_length + 1) % len(self.tokens)
        return self.tokens[positions]

    def micro_batches(
        self, consumed_samples: int, micro_batch_size: int, dp_rank: int, dp_size: int, num_micro_batches: int
    ) -> list[Batch]:
        """This DP rank's micro-batches of the step that starts at `consumed_samples`."""
        batches = []
        for m in range(num_micro_batches):
            first = consumed_samples + m * micro_batch_size * dp_size + dp_rank * micro_batch_size
            rows = torch.stack([self.sample(first + j) for j in range(micro_batch_size)])
            batches.append(Batch(tokens=rows[:, :-1].contiguous(), labels=rows[:, 1:].contiguous()))
        return batches
