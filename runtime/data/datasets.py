"""The train and valid datasets of a run, built by megatron-core as Megatron-LM builds them.

`BlendedMegatronDatasetBuilder(GPTDataset, ...)` over `train.data.sources` (prefixes and weights, as
`--data-path`) with `train.data.split`, `train.seq_length` and `train.seed`, asked for the Plan's
sample counts (plan.trained().batch.samples). The builder coordinates the ranks itself: rank 0 builds and
caches the document/sample/shuffle indices, a barrier, then the others load them. The cache lives
in the run directory (`<run dir>/datasets/cache`), never beside the user's data. As in Megatron-LM,
a multi-node job needs that directory on a filesystem every node sees.

The built-in corpus (`sources: null`) takes the same path: rank 0 prepares the shipped documents
with the spec's tokenizer into `<run dir>/datasets/builtin_<tokenizer sha256[:12]>` (once; a matching
sidecar means it is there), then it is a blend of one source.

GPTDataset's attention mask is not asked for (the trainers pass the causal one) and its loss mask is
all ones here: no end-of-document masking, and no padding, since a split never yields a partial
sequence (Megatron drops the last partial validation sequence). So samples are (tokens, labels).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch.distributed as dist

from lmspec.compiler.build.files import DATA_DIR, TOKENIZER_DIR
from lmspec.compiler.data.sidecar import read_sidecar
from lmspec.compiler.data.tokenizer_files import padded_vocab_size
from lmspec.compiler.plan import Plan
from lmspec.compiler.spec.sections import TrainingSpec
from lmspec.runtime.data.builtin_corpus import corpus_files
from lmspec.runtime.data.byte_tokenizer import has_tokenizer, save_byte_tokenizer
from lmspec.runtime.data.tokenizer import TextTokenizer, load_tokenizer

CACHE_DIR = "cache"  # under <run dir>/datasets: megatron-core's index cache (path_to_cache)
BUILTIN_PREFIX = "builtin_"


class DataError(ValueError):
    """Training data the model cannot take; the text names the key, the value and the fix."""


@dataclass(frozen=True)
class TrainingData:
    tokenizer: TextTokenizer
    train: Any  # megatron-core BlendedDataset / GPTDataset: dataset[i] -> {"tokens", "labels", ...}
    valid: Any | None  # None when the run never validates (train.eval_iters=0)


class MegatronTokenizerView:
    """What GPTDataset reads of a tokenizer: the vocabulary size (token dtype), the end-of-document id, and
    `unique_identifiers` (in the cache key, so datasets of another tokenizer never share indices). No `pad`:
    GPTDataset then pads with -1, an id no dataset holds."""

    def __init__(self, tokenizer: TextTokenizer) -> None:
        self.vocab_size = tokenizer.files.vocab_size
        self.eod = tokenizer.eod_id
        self.unique_identifiers = {"class": type(self).__name__, "tokenizer_sha256": tokenizer.files.sha256}


def _rank0() -> bool:
    return not dist.is_initialized() or dist.get_rank() == 0


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def run_tokenizer(spec: TrainingSpec, run_dir: Path) -> TextTokenizer:
    """The spec's tokenizer: train.data.tokenizer_path, or the byte tokenizer written into the run directory
    (by rank 0, the others wait). DataError when its ids do not fit the model's embedding."""
    data = spec.train.data
    if data.tokenizer == "hf":
        assert data.tokenizer_path is not None  # the schema requires it with tokenizer=hf
        tokenizer = load_tokenizer(Path(data.tokenizer_path))
        key = f"train.data.tokenizer_path={data.tokenizer_path!r}"
    else:
        directory = run_dir / TOKENIZER_DIR
        if _rank0() and not has_tokenizer(directory):
            save_byte_tokenizer(directory)
        _barrier()
        tokenizer = load_tokenizer(directory)
        key = "train.data.tokenizer=byte"
    if tokenizer.files.vocab_size > spec.model.vocab_size:
        raise DataError(
            f"{key}: the tokenizer has {tokenizer.files.vocab_size} ids but model.vocab_size="
            f"{spec.model.vocab_size}; compile with model.vocab_size={padded_vocab_size(tokenizer.files.vocab_size)} "
            "or a tokenizer whose ids fit"
        )
    return tokenizer


def builtin_prefix(tokenizer: TextTokenizer, run_dir: Path) -> Path:
    """The shipped corpus as a Megatron dataset of `tokenizer`, prepared by rank 0 when not there yet."""
    from lmspec.runtime.data.prepare import prepare

    prefix = run_dir / DATA_DIR / f"{BUILTIN_PREFIX}{tokenizer.files.sha256[:12]}"
    if _rank0():
        sidecar = read_sidecar(prefix)
        if sidecar is None or sidecar.tokenizer_sha256 != tokenizer.files.sha256:
            prepare(corpus_files(), tokenizer, prefix, workers=1, append_eod=True, progress=False)
    _barrier()
    return prefix


def source_blend(spec: TrainingSpec, tokenizer: TextTokenizer, run_dir: Path) -> tuple[list[str], list[float]]:
    """train.data.sources as Megatron's --data-path (prefixes, weights); the built-in corpus as one source."""
    sources = spec.train.data.sources
    if sources is None:
        return [str(builtin_prefix(tokenizer, run_dir))], [1.0]
    return [s.path for s in sources], [s.weight for s in sources]


def gpt_config(
    spec: TrainingSpec,
    run_dir: Path,
    tokenizer: TextTokenizer,
    blend: tuple[list[str], list[float] | None],
    seq_length: int,
    split: str,
) -> Any:
    """megatron-core's GPTDatasetConfig as lmspec builds every dataset of a run: the run's seed, the index
    cache in the run directory, (tokens, labels) samples without masks."""
    from megatron.core.datasets.gpt_dataset import GPTDatasetConfig

    return GPTDatasetConfig(
        random_seed=spec.train.seed,
        sequence_length=seq_length,
        blend=blend,
        split=split,
        path_to_cache=str(run_dir / DATA_DIR / CACHE_DIR),
        tokenizer=MegatronTokenizerView(tokenizer),
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        create_attention_mask=False,
    )


def build_datasets(spec: TrainingSpec, plan: Plan) -> TrainingData:
    """The run's train and valid datasets (call on every rank: the builder synchronises them)."""
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset

    run_dir = Path(plan.paths.run_dir)
    data, samples = spec.train.data, plan.trained().batch.samples
    tokenizer = run_tokenizer(spec, run_dir)
    prefixes, weights = source_blend(spec, tokenizer, run_dir)
    config = gpt_config(spec, run_dir, tokenizer, (prefixes, weights), spec.train.seq_length, data.split)
    sizes = [samples.train, samples.valid, 0]  # lmspec never reads the test split
    # A split nothing is drawn from is not built: Megatron would loop forever asking an empty split
    # (the test split of a small corpus) for its one extra token. The others keep Megatron's boundaries.
    assert config.split_matrix is not None
    config.split_matrix = [bounds if size else None for bounds, size in zip(config.split_matrix, sizes, strict=True)]
    train, valid, _ = BlendedMegatronDatasetBuilder(GPTDataset, sizes, lambda: True, config).build()
    return TrainingData(tokenizer=tokenizer, train=train, valid=valid)
