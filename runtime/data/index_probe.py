"""What megatron-core itself says about a dataset prefix, without building a GPTDataset (so no
sample index is computed and no cache written): its IndexedDataset reading the .idx, and its
BlendedMegatronDatasetBuilder's division of the documents between train, valid and test.

Imported only when a run has `train.data.sources` (megatron-core takes ~6 s to import here).
"""

from __future__ import annotations

import warnings
from typing import Any

with warnings.catch_warnings():
    # megatron-core warns on import that Transformer Engine and Apex are missing: true, and no news here
    warnings.filterwarnings("ignore", message="Transformer Engine and Apex are not installed")
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.blended_megatron_dataset_config import BlendedMegatronDatasetConfig
    from megatron.core.datasets.gpt_dataset import GPTDataset
    from megatron.core.datasets.indexed_dataset import IndexedDataset
    from megatron.core.datasets.utils import Split

SPLIT_NAMES = tuple(s.name for s in Split)  # train, valid, test: the order of Megatron's --split


class OpenedDataset(IndexedDataset):
    """megatron-core's IndexedDataset (its header, version, dtype and count checks), the .bin not mapped.

    Its own `__del__` raises AttributeError on an object whose .idx could not be read, which Python
    prints as "Exception ignored ... Traceback" after the clean refusal; this one cleans up only what
    was made.
    """

    def __init__(self, prefix: str) -> None:
        super().__init__(prefix, mmap=False)

    def __del__(self) -> None:
        if hasattr(self, "index"):
            super().__del__()


class SplitShare:
    """Built by Megatron's BlendedMegatronDatasetBuilder in GPTDataset's place: how many documents and
    tokens the builder gave one split."""

    def __init__(self, dataset: Any, path: str, indices: Any, samples: Any, split: Any, config: Any) -> None:
        self.documents = len(indices)
        self.tokens = int(dataset.sequence_lengths[indices].sum(dtype="int64"))

    def __len__(self) -> int:
        return self.documents

    @staticmethod
    def build_low_level_dataset(path: str, config: Any) -> OpenedDataset:
        return OpenedDataset(path)

    @staticmethod
    def numel_low_level_dataset(dataset: OpenedDataset) -> int:
        return int(GPTDataset.numel_low_level_dataset(dataset))  # GPT splits by sequence (= document here)


def split_shares(prefix: str, split: str, seed: int, seq_length: int) -> list[SplitShare | None]:
    """Megatron's division of one source between the splits (None: a split of weight 0), as its
    builder makes it for every source of a blend."""
    config = BlendedMegatronDatasetConfig(
        random_seed=seed, sequence_length=seq_length, blend=([prefix], None), split=split, mmap_bin_files=False
    )
    return list(BlendedMegatronDatasetBuilder(SplitShare, [None] * len(Split), lambda: True, config).build())
