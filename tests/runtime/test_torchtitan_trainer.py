"""The torchtitan backend's trainer (lmspec.runtime.train.torchtitan) on CPU/gloo, through helpers.torchtitan_worker.

The worker builds torchtitan.json's document by hand from a compiled plan and trains with TorchtitanTrainer
directly, so these hold before the backend can be compiled and run with `lmspec run`: FSDP2 over 1, 2 and 4
ranks (HSDP: 2 replicas of 2 shards) and tensor parallelism (TP 2, and TP 2 x FSDP2 2) train the same global
batches to the same losses as one rank, with gradient accumulation; a DCP checkpoint resumes bitwise, and a TP
one under FSDP2 alone (DCP reshards the 2-D DTensors); full activation checkpointing changes no loss; the tiny
MoE model trains sharded. The document's parser and the layout check need no ranks.
"""

from __future__ import annotations

import math
import re
from typing import Any

import pytest
from helpers.parity_sweep import RELATIVE_TOLERANCE
from helpers.torchtitan_runs import MOE, Job, Runs

from lmspec.compiler.models.lr_schedule import lr_at
from lmspec.compiler.pipeline import make_plan
from lmspec.runtime.train.torchtitan.job_config import JobConfig
from lmspec.runtime.train.torchtitan.parallelize import layout_problems

# the reference every multi-rank run and the resumed run are compared with: one rank, 4 steps, saved after 2
REFERENCE = Job(world=1, save_after=2)
TP2 = Job(world=2, tp=2, save_after=2)  # tensor parallel over both ranks, saved after step 2


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    return Runs(tmp_path_factory.mktemp("torchtitan"))


def _relative(a: dict[int, float], b: dict[int, float]) -> float:
    assert a.keys() == b.keys()
    return max(abs(a[s] - b[s]) / abs(b[s]) for s in a)


def _document(**changes: dict[str, Any]) -> dict[str, Any]:
    """A torchtitan.json document for 2 ranks, 2 micro-batches of 4 (the brief's sections); `changes`
    replace keys of a section."""
    doc: dict[str, Any] = {
        "model": {"name": "llama", "flavor": "tiny"},
        "training": {"local_batch_size": 4, "global_batch_size": 16, "seq_len": 128, "steps": 30, "max_norm": 1.0,
                     "mixed_precision_param": "float32", "mixed_precision_reduce": "float32", "seed": 1234},
        "optimizer": {"name": "AdamW", "lr": 3e-3, "eps": 1e-8, "beta1": 0.9, "beta2": 0.95, "weight_decay": 0.1},
        "parallelism": {"data_parallel_replicate_degree": 1, "data_parallel_shard_degree": 2,
                        "fsdp_reshard_after_forward": "always", "tensor_parallel_degree": 1,
                        "disable_loss_parallel": True, "enable_async_tensor_parallel": False,
                        "pipeline_parallel_degree": 1, "context_parallel_degree": 1},
        "activation_checkpoint": {"mode": "none"},
        "checkpoint": {"enable": True, "folder": "torchtitan", "interval": 10, "async_mode": "disabled",
                       "initial_load_path": None, "initial_load_model_only": True},
    }  # fmt: skip
    for section, keys in changes.items():
        doc[section] = {**doc[section], **keys}
    return doc


def test_the_document_parses_into_typed_sections() -> None:
    config = JobConfig.parse({**_document(), "job": {"description": "tiny"}, "compile": {"enable": False}})
    assert (
        config.parallelism.dp == 2 and config.training.max_norm == 1.0 and config.activation_checkpoint.mode == "none"
    )
    assert layout_problems(config, world_size=2, micro_batch_size=4, grad_accum_steps=2) == []


@pytest.mark.parametrize(
    "doc, error",
    [
        pytest.param({**_document(), "float8": {}}, "unknown section(s) ['float8']", id="section"),
        pytest.param(_document(training={"local_batch": 4}), "local_batch", id="key"),
        pytest.param({**_document(), "compile": {"enable": True}}, "runs eagerly", id="compile"),
    ],
)
def test_the_document_refuses_what_the_trainer_does_not_run(doc: dict, error: str) -> None:
    with pytest.raises((TypeError, ValueError), match=re.escape(error)):
        JobConfig.parse(doc)


def test_a_layout_that_does_not_match_the_ranks_names_every_factor() -> None:
    parallelism = {"data_parallel_replicate_degree": 2, "tensor_parallel_degree": 2, "pipeline_parallel_degree": 2}
    config = JobConfig.parse(
        _document(
            parallelism={**parallelism, "disable_loss_parallel": False, "enable_async_tensor_parallel": True},
            training={"seq_len": 127},
        )
    )
    problems = layout_problems(config, world_size=2, micro_batch_size=4, grad_accum_steps=2)
    assert problems == [
        "parallelism.pipeline_parallel_degree=2: this trainer runs data and tensor parallelism only (1)",
        "parallelism.disable_loss_parallel=false: this trainer gathers the logits whole (true)",
        "parallelism.enable_async_tensor_parallel=true: this trainer runs eagerly (false)",
        "data_parallel_replicate_degree(2) * data_parallel_shard_degree(2) * tensor_parallel_degree(2) "
        "!= WORLD_SIZE(2)",
        "training.seq_len(127) does not divide by tensor_parallel_degree(2): sequence parallelism splits it evenly",
        "training.global_batch_size(16) != training.local_batch_size(4) * dp(4) * plan.json's grad_accum_steps(2) "
        "(plan.json's micro_batch_size=4)",
    ]


@pytest.mark.slow
def test_one_two_and_four_ranks_train_the_same_losses(runs: Runs) -> None:
    """FSDP2 over 2 ranks, HSDP over 4 (2 replicas x 2 shards), TP over 2 (accumulating 8 on its one
    data-parallel rank) and TP 2 x FSDP2 2, against one rank accumulating 8: only the order of the sums
    differs (helpers.parity_sweep's tolerance)."""
    reference = runs(REFERENCE)
    assert reference.losses[4] < reference.losses[1]  # it learns
    train = make_plan(list(REFERENCE.overrides)).trained().spec.train
    assert reference.lrs == {step: lr_at(train, step) for step in reference.lrs}
    for job in (Job(world=2, save_after=2), Job(world=4, replicate=2), TP2, Job(world=4, tp=2)):
        result = runs(job)
        assert _relative(result.losses, reference.losses) <= RELATIVE_TOLERANCE, (job, result.losses)
        assert _relative(result.grad_norms, reference.grad_norms) <= RELATIVE_TOLERANCE, (job, result.grad_norms)
        assert result.eval_loss == pytest.approx(reference.eval_loss, rel=RELATIVE_TOLERANCE)
        assert result.lrs == reference.lrs


@pytest.mark.parametrize("world", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_a_resumed_run_trains_the_steps_after_its_checkpoint_bitwise(runs: Runs, world: int) -> None:
    """Steps 3-4 after loading the step-2 DCP checkpoint (model and optimizer shards, the scheduler's count)
    are the uninterrupted run's, bit for bit."""
    uninterrupted = runs(Job(world=world, save_after=2))
    assert uninterrupted.saved is not None
    resumed = runs(Job(world=world, first_step=3, load=uninterrupted.saved))
    assert resumed.losses == {s: uninterrupted.losses[s] for s in (3, 4)}
    assert resumed.grad_norms == {s: uninterrupted.grad_norms[s] for s in (3, 4)}
    assert resumed.lrs == {s: uninterrupted.lrs[s] for s in (3, 4)}


@pytest.mark.slow
def test_a_tensor_parallel_checkpoint_resumes_under_fsdp2_alone(runs: Runs) -> None:
    """TP 2's step-2 save (2-D DTensors: TP shards, on a data-parallel mesh of one) loaded by FSDP2 over 2
    ranks, which DCP reshards: steps 3-4 are the TP run's within the parity tolerance (the sums' order
    differs), the scheduler's count carried over."""
    uninterrupted = runs(TP2)
    assert uninterrupted.saved is not None
    resumed = runs(Job(world=2, first_step=3, load=uninterrupted.saved))
    tp_steps = {s: uninterrupted.losses[s] for s in (3, 4)}
    assert _relative(resumed.losses, tp_steps) <= RELATIVE_TOLERANCE, (resumed.losses, tp_steps)
    assert resumed.lrs == {s: uninterrupted.lrs[s] for s in (3, 4)}


def test_full_activation_checkpointing_changes_no_loss(runs: Runs) -> None:
    """Every decoder layer recomputed in the backward: the same gradients, so the same losses."""
    reference = runs(REFERENCE)
    recomputed = runs(Job(world=1, activation_checkpoint="full"))
    assert (reference.checkpointed, recomputed.checkpointed) == (0, 4)  # the tiny model's 4 layers
    assert _relative(recomputed.losses, reference.losses) <= 1e-6, (recomputed.losses, reference.losses)


@pytest.mark.slow
def test_the_tiny_moe_model_trains_sharded_over_two_ranks(runs: Runs) -> None:
    """DeepSeek-V3's MoE blocks (experts as one 3-D parameter each, so every rank reduces the same
    gradients whichever experts its tokens reach) under FSDP2, against one rank."""
    one, two = runs(Job(world=1, overrides=MOE, last_step=2)), runs(Job(world=2, overrides=MOE, last_step=2))
    assert all(math.isfinite(loss) for loss in two.losses.values()) and len(two.losses) == 2
    assert _relative(two.losses, one.losses) <= RELATIVE_TOLERANCE, (two.losses, one.losses)
