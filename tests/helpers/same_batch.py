"""Runs whose every batch is one sequence: a corpus of identical documents of exactly train.seq_length
tokens (the document's bytes and the end-of-text id). A run's loss at step k is then the loss of the weights
after step k - 1 on THE batch, whatever the data order, so two layouts started from the same weights must
log the same losses (tests/runtime/test_interleaved_pipeline.py, test_uneven_chunks.py)."""

from __future__ import annotations

from pathlib import Path

from helpers.build import compile_build
from helpers.datasets import prepare_dataset
from helpers.torchrun import Run, run

SEQ_LENGTH = 128  # hardware=cpu's train.seq_length


def same_batch_workdir(root: Path, phrase: str) -> Path:
    """`root` with a byte tokenizer and a corpus of 64 copies of `phrase`, repeated to one sequence."""
    from lmspec.runtime.data.byte_tokenizer import save_byte_tokenizer

    tokenizer = root / "tokenizer"
    tokenizer.mkdir()
    save_byte_tokenizer(tokenizer)
    document = (phrase * (SEQ_LENGTH // len(phrase) + 1))[: SEQ_LENGTH - 1]  # + end-of-text = SEQ_LENGTH
    prefix = prepare_dataset(root / "data" / "same", [document] * 64, tokenizer, append_eod=True)
    (root / "data.txt").write_text(
        f"train.data.tokenizer=hf\ntrain.data.tokenizer_path={tokenizer}\n"
        f"train.data.sources=[{{path:{prefix},weight:1.0}}]\n"
    )
    return root


def train_on_the_batch(workdir: Path, name: str, overrides: list[str]) -> Run:
    """Compile `name` on the workdir's corpus with `overrides` and run it to completion."""
    data = (workdir / "data.txt").read_text().split()
    build = compile_build(workdir / "build", [f"name={name}", *data, *overrides]).dir
    result = run(build, workdir)
    assert result.code == 0, result.output[-4000:]
    return result
