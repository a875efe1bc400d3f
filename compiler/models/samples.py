"""How many samples each split must supply: the sizes Megatron's dataset builder is asked for.

As Megatron-LM's `build_train_valid_test_datasets`: train = steps x global batch; valid =
the evaluations the run will make x eval_iters global batches each. Validation runs every
`train.eval_interval` steps and after the last, and evaluation k reads valid samples
[k x eval_iters x G, (k+1) x eval_iters x G): a pure function of the step, so a resumed run
validates on exactly the samples the uninterrupted run would have.
"""

from __future__ import annotations

from dataclasses import dataclass

from lmspec.compiler.spec.sections import TrainSpec


@dataclass(frozen=True)
class SplitSamples:
    train: int
    valid: int
    evaluations: int  # validations during the run (0 when train.eval_iters is 0)
    samples_per_evaluation: int  # eval_iters x global batch


def split_samples(train: TrainSpec) -> SplitSamples:
    evaluations = -(-train.steps // train.eval_interval) if train.eval_iters else 0
    per_evaluation = train.eval_iters * train.global_batch_size
    return SplitSamples(
        train=train.steps * train.global_batch_size,
        valid=evaluations * per_evaluation,
        evaluations=evaluations,
        samples_per_evaluation=per_evaluation,
    )


def evaluates_after(train: TrainSpec, step: int) -> bool:
    """Whether validation runs after optimizer step `step` (1-based)."""
    return train.eval_iters > 0 and (step % train.eval_interval == 0 or step == train.steps)


def evaluation_index(train: TrainSpec, step: int) -> int:
    """Which evaluation (0-based) runs after `step`: it picks that evaluation's valid samples."""
    return (step - 1) // train.eval_interval
