"""The byte-level token stream: reproducible, DP shards that tile the global batch, resumable by position."""

from __future__ import annotations

import torch

from lmspec.runtime.train.data import EOT_ID, TokenStream, decode, encode


def _stream(seed: int = 1234) -> TokenStream:
    return TokenStream("builtin", seq_length=128, seed=seed, vocab_size=512)


def test_byte_tokenizer_round_trips() -> None:
    text = "Checkpoints survive kill -9: ünïcode too."
    assert decode(encode(text)) == text
    assert max(encode(text)) < 256 < EOT_ID + 1


def test_stream_is_reproducible_and_seeded() -> None:
    a, b, c = _stream(), _stream(), _stream(seed=7)
    assert torch.equal(a.sample(5), b.sample(5))
    assert not all(torch.equal(a.sample(i), c.sample(i)) for i in range(4))
    assert a.sample(0).shape == (129,)


def test_dp_ranks_tile_the_global_batch_and_labels_shift() -> None:
    stream = _stream()
    consumed, micro, dp, accum = 48, 4, 2, 2
    rows = []
    for m in range(accum):
        for r in range(dp):
            batch = stream.micro_batches(consumed, micro, r, dp, accum)[m]
            assert torch.equal(batch.tokens[:, 1:], batch.labels[:, :-1])
            rows.append(batch.tokens)
    expected = torch.stack([stream.sample(consumed + i)[:-1] for i in range(micro * dp * accum)])
    assert torch.equal(torch.cat(rows), expected)


def test_same_global_stream_for_any_dp_degree() -> None:
    stream = _stream()
    one = stream.micro_batches(16, 4, 0, 1, 4)
    two = [stream.micro_batches(16, 4, r, 2, 2)[m] for m in range(2) for r in range(2)]
    assert torch.equal(torch.cat([b.tokens for b in one]), torch.cat([b.tokens for b in two]))
