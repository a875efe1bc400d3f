"""The quantize stage's sequences: calibration and held-back evaluation, read by megatron-core as training reads.

By default they come from the validation split of train.data: the documents training held out, divided
by train.data.split as the run divided them, every source whole (no re-weighting: each held-out
document counts once). quantize.calibration.data names a prepared dataset instead, read whole. Either
way megatron-core's GPTDataset cuts one epoch into sequences of quantize.calibration.seq_length tokens
and shuffles them with the run's seed; the first `samples` calibrate, the next `eval_samples` are only
measured. A split too small for both is refused (UsageError) naming the keys, never repeated to fill
the count: a repeated sequence calibrates nothing new, and one calibrated on cannot be held back.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from lmspec.compiler.errors import UsageError
from lmspec.compiler.spec.sections import TrainingSpec
from lmspec.compiler.spec.sections.quantize import QuantizeSpec
from lmspec.runtime.data.datasets import gpt_config, run_tokenizer, source_blend

WHOLE_AS_VALID = "0,1,0"  # a named calibration dataset: all of it in the split read here


@dataclass(frozen=True)
class Sequences:
    calibration: torch.Tensor  # [samples, seq_length] token ids
    evaluation: torch.Tensor  # [eval_samples, seq_length]
    source: str  # what they were read from, for the report


def held_out(spec: TrainingSpec, quantize: QuantizeSpec, run_dir: Path) -> Sequences:
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset

    c = quantize.calibration
    tokenizer = run_tokenizer(spec, run_dir)
    if c.data is None:
        prefixes, _ = source_blend(spec, tokenizer, run_dir)
        split, source = (
            spec.train.data.split,
            f"the validation split of train.data (train.data.split={spec.train.data.split})",
        )
    else:
        prefixes, split, source = [c.data], WHOLE_AS_VALID, f"quantize.calibration.data={c.data}"
    config = gpt_config(spec, run_dir, tokenizer, (prefixes, None), c.seq_length, split)
    assert config.split_matrix is not None
    config.split_matrix = [None, config.split_matrix[1], None]  # the validation split alone
    sizes = [None, None, None]  # one epoch, nothing drawn twice
    _, valid, _ = BlendedMegatronDatasetBuilder(GPTDataset, sizes, lambda: True, config).build()
    wanted = c.samples + c.eval_samples
    available = 0 if valid is None else len(valid)
    if available < wanted:
        raise UsageError(
            f"quantize.calibration.samples={c.samples} + quantize.calibration.eval_samples={c.eval_samples} "
            f"sequences of quantize.calibration.seq_length={c.seq_length} tokens, but {source} holds "
            f"{available}; lower them or the sequence length, or name a larger prepared dataset in "
            "quantize.calibration.data"
        )
    rows = torch.stack([torch.as_tensor(valid[i]["tokens"], dtype=torch.int64) for i in range(wanted)])
    return Sequences(calibration=rows[: c.samples], evaluation=rows[c.samples :], source=source)
