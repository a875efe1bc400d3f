"""Documents to token ids: one batch in this process, or many on a pool of worker processes, kept in order.

Only this module and the readers are imported by a worker (numpy, tokenizers, json: ~40 MB), never
the parent's torch/megatron/transformers; the parent writes the results in input order, so the
dataset is byte-identical for any number of workers.
"""

from __future__ import annotations

import array
import itertools
import multiprocessing
import os
import signal
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass

from lmspec.runtime.data.readers import Batch, batch_texts
from lmspec.runtime.data.tokenizer import TextTokenizer

IN_FLIGHT_PER_WORKER = 2  # batches submitted ahead per worker: keeps them busy, bounds memory


@dataclass(frozen=True)
class Encoded:
    """A batch's token ids, concatenated in the dataset's dtype, and each document's length."""

    tokens: array.array[int]  # not numpy: a worker then never imports it (~20 MB less per worker)
    lengths: list[int]


@dataclass(frozen=True)
class Encoder:
    """What a worker needs to encode a batch: picklable, so a spawned worker receives it once."""

    tokenizer: TextTokenizer
    typecode: str  # array module code of the dataset's dtype: "H" uint16, "i" int32 (numpy's dtype.char)
    eod_id: int | None  # appended to every document when set

    def __call__(self, batch: Batch) -> Encoded:
        ids = self.tokenizer.encode_batch(batch_texts(batch))
        if self.eod_id is not None:
            for doc in ids:
                doc.append(self.eod_id)
        lengths = [len(doc) for doc in ids]
        return Encoded(array.array(self.typecode, itertools.chain.from_iterable(ids)), lengths)


def encode_in_workers(
    batches: Iterator[Batch], encoder: Encoder, workers: int, write: Callable[[Encoded], None]
) -> None:
    """Encode on `workers` processes, results written in input order (so output is the same for any N)."""
    # spawn, not fork: a worker imports this module, the readers, numpy and tokenizers only, not the
    # parent's torch/megatron/transformers pages (~380 MB), and no thread is forked holding a lock.
    context = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(workers, mp_context=context, initializer=_start_worker, initargs=(encoder,))
    pending: deque[Future[Encoded]] = deque()
    try:
        for batch in batches:
            pending.append(pool.submit(_encode_in_worker, batch))
            if len(pending) >= IN_FLIGHT_PER_WORKER * workers:
                write(pending.popleft().result())
        while pending:
            write(pending.popleft().result())
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


_WORKER_ENCODER: Encoder | None = None


def _start_worker(encoder: Encoder) -> None:
    """A worker leaves Ctrl-C to the parent, which stops the pool and removes the staging directory."""
    global _WORKER_ENCODER
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ["RAYON_NUM_THREADS"] = "1"  # read when the tokenizer first encodes: one core per worker
    _WORKER_ENCODER = encoder


def _encode_in_worker(batch: Batch) -> Encoded:
    assert _WORKER_ENCODER is not None, "the pool's initializer sets the encoder"
    return _WORKER_ENCODER(batch)
