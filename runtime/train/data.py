"""Micro-batches of a megatron-core dataset, DP-sharded by a pure function of the sample position.

Sample `i` of a dataset (lmspec.runtime.data.datasets) is fixed by the data, the split and the seed,
so the position saved in a checkpoint is just `consumed_samples`, and the samples of a step are the
same for any data-parallel degree: step s, micro-batch m, DP rank r takes global samples
consumed + m*(mb*dp) + r*mb ... + mb - 1 (consumed = s*G, G = global batch). Validation k reads the
valid split's samples from k*eval_iters*G the same way (compiler/models/samples.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Batch:
    tokens: torch.Tensor  # [micro, seq] input ids
    labels: torch.Tensor  # [micro, seq] next-token ids


def micro_batches(
    dataset: Any, first_sample: int, micro_batch_size: int, dp_rank: int, dp_size: int, num_micro_batches: int
) -> list[Batch]:
    """This DP rank's `num_micro_batches` micro-batches of the global batch(es) starting at `first_sample`."""
    batches = []
    for m in range(num_micro_batches):
        first = first_sample + m * micro_batch_size * dp_size + dp_rank * micro_batch_size
        samples = [dataset[first + j] for j in range(micro_batch_size)]
        batches.append(
            Batch(
                tokens=torch.stack([s["tokens"] for s in samples]),
                labels=torch.stack([s["labels"] for s in samples]),
            )
        )
    return batches
