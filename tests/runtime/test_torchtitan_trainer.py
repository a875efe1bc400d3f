"""The torchtitan backend's trainer (lmspec.runtime.train.torchtitan) on CPU/gloo, through helpers.torchtitan_worker.

The worker builds torchtitan.json's document by hand from a compiled plan and trains with TorchtitanTrainer
directly, so these hold before the backend can be compiled and run with `lmspec run`: FSDP2 over 1, 2 and 4
ranks (HSDP: 2 replicas of 2 shards), tensor parallelism (TP 2, and TP 2 x FSDP2 2) and pipeline parallelism
(1F1B over 2 stages, with FSDP2 2 and with TP 2; Interleaved1F1B, 2 stages per rank) train the same global
batches to the same losses as one rank, with gradient accumulation; a DCP checkpoint resumes bitwise, a TP one
under FSDP2 alone (DCP reshards the 2-D DTensors), a pipeline's without one and one rank's under an interleaved
pipeline; full activation checkpointing changes no loss; the tiny MoE model trains sharded and pipelined. The
document's parser and the layout check need no ranks.
"""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path
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
PP2 = Job(world=2, pp=2, save_after=2)  # a 1F1B pipeline of 2 stages, saved after step 2


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
                        "pipeline_parallel_degree": 1, "pipeline_parallel_schedule": "1F1B",
                        "pipeline_parallel_microbatch_size": 4, "module_fqns_per_model_part": None,
                        "context_parallel_degree": 1},
        "activation_checkpoint": {"mode": "none", "selective_ac_option": "op"},
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
    parallelism = {"data_parallel_replicate_degree": 2, "tensor_parallel_degree": 2, "context_parallel_degree": 2}
    config = JobConfig.parse(
        _document(
            parallelism={**parallelism, "disable_loss_parallel": False, "enable_async_tensor_parallel": True},
            training={"seq_len": 127},
        )
    )
    problems = layout_problems(config, world_size=2, micro_batch_size=4, grad_accum_steps=2)
    assert problems == [
        "parallelism.context_parallel_degree=2: this trainer runs no context parallelism (1)",
        "parallelism.disable_loss_parallel=false: this trainer gathers the logits whole (true)",
        "parallelism.enable_async_tensor_parallel=true: this trainer runs eagerly (false)",
        "data_parallel_replicate_degree(2) * data_parallel_shard_degree(2) * tensor_parallel_degree(2) "
        "* pipeline_parallel_degree(1) != WORLD_SIZE(2)",
        "training.seq_len(127) does not divide by tensor_parallel_degree(2): sequence parallelism splits it evenly",
        "training.global_batch_size(16) != training.local_batch_size(4) * dp(4) * plan.json's grad_accum_steps(2) "
        "(plan.json's micro_batch_size=4)",
    ]


def test_a_pipeline_runs_the_steps_micro_batches_in_its_schedule() -> None:
    """Under a pipeline local_batch_size is the data-parallel rank's step (the schedule's micro-batches of
    pipeline_parallel_microbatch_size) and the stages fit the schedule: each mismatch named."""
    stages = [["model.embed_tokens", "model.layers.0", "model.layers.1"], ["model.layers.2", "model.layers.3"]]
    pipeline = {"data_parallel_shard_degree": 1, "pipeline_parallel_degree": 2, "module_fqns_per_model_part": stages}
    good = JobConfig.parse(_document(parallelism=pipeline, training={"local_batch_size": 8, "global_batch_size": 8}))
    assert layout_problems(good, world_size=2, micro_batch_size=4, grad_accum_steps=2) == []
    looped = {**pipeline, "pipeline_parallel_schedule": "Interleaved1F1B"}
    config = JobConfig.parse(_document(parallelism=looped))
    assert layout_problems(config, world_size=2, micro_batch_size=4, grad_accum_steps=2) == [
        "training.local_batch_size(4) != pipeline_parallel_microbatch_size(4) * plan.json's grad_accum_steps(2) "
        "(plan.json's micro_batch_size=4): the schedule runs a step's micro-batches",
        "training.global_batch_size(16) != training.local_batch_size(4) * dp(1): under a pipeline nothing "
        "accumulates outside the schedule",
        "parallelism.module_fqns_per_model_part lists 2 stage(s) for pipeline_parallel_degree(2) and "
        "pipeline_parallel_schedule='Interleaved1F1B' (1F1B: one stage per rank; Interleaved1F1B: two or more "
        "per rank, as many on each)",
    ]


@pytest.mark.parametrize(
    "stages, error",
    [
        pytest.param([["model.embed_tokens", "model.layers.0", "model.layers.2"], ["model.layers.1", "model.norm",
                      "lm_head"]], "layers [0, 2, 1]", id="order"),
        pytest.param([["model.embed_tokens", "model.layers.0", "model.layers.1", "model.layers.2", "model.layers.3"],
                      ["model.norm", "lm_head"]], "stage(s) [1] hold no decoder layer", id="empty"),
        pytest.param([["model.layers.0", "model.layers.1"], ["model.embed_tokens", "model.layers.2", "model.layers.3",
                      "model.norm", "lm_head"]], "model.embed_tokens on the first stage", id="embedding"),
    ],
)  # fmt: skip
def test_a_stage_split_that_is_not_the_model_is_refused(stages: list[list[str]], error: str) -> None:
    from lmspec.runtime.train.torchtitan.pipeline import part_problems

    assert error in "; ".join(part_problems(stages, num_layers=4))


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


@pytest.mark.slow
def test_pipelines_train_the_same_losses_as_one_rank(runs: Runs) -> None:
    """1F1B over 2 stages (8 micro-batches), with FSDP2 over 2 ranks per stage and with TP 2 per stage, and
    Interleaved1F1B with 2 stages per rank, against one rank accumulating 8: losses, gradient norms (summed over
    the stages) and the forward-only schedule's evaluation loss."""
    reference = runs(REFERENCE)
    for job in (PP2, Job(world=4, pp=2), Job(world=4, pp=2, tp=2), Job(world=2, pp=2, virtual_stages=2)):
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
def test_a_pipeline_checkpoint_resumes_without_one_and_one_rank_s_under_an_interleaved_one(runs: Runs) -> None:
    """Each rank saves its stages' model and optimizer entries under the whole model's names (the optimizer
    flattened per parameter), so a 2-stage pipeline's step-2 save resumes under FSDP2 over 2 ranks, and one
    rank's under Interleaved1F1B (2 stages per rank): steps 3-4 within the parity tolerance of the saving run."""
    for saved, resumed_as in (
        (PP2, Job(world=2, first_step=3)),
        (REFERENCE, Job(world=2, pp=2, virtual_stages=2, first_step=3)),
    ):
        uninterrupted = runs(saved)
        assert uninterrupted.saved is not None
        resumed = runs(dataclasses.replace(resumed_as, load=uninterrupted.saved))
        steps = {s: uninterrupted.losses[s] for s in (3, 4)}
        assert _relative(resumed.losses, steps) <= RELATIVE_TOLERANCE, (resumed_as, resumed.losses, steps)
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


def test_per_op_activation_checkpointing_changes_no_loss(runs: Runs) -> None:
    """torchtitan's per-op policy (train.recompute=selective): every second matmul and the elementwise ops
    recomputed from the saved outputs of the others, so the same gradients."""
    reference = runs(REFERENCE)
    recomputed = runs(Job(world=1, activation_checkpoint="selective"))
    assert recomputed.checkpointed == 4  # the tiny model's 4 layers
    assert _relative(recomputed.losses, reference.losses) <= 1e-6, (recomputed.losses, reference.losses)


@pytest.mark.slow
def test_the_tiny_moe_model_trains_sharded_over_two_ranks(runs: Runs) -> None:
    """DeepSeek-V3's MoE blocks (experts as one 3-D parameter each, so every rank reduces the same
    gradients whichever experts its tokens reach) under FSDP2, against one rank."""
    one, two = runs(Job(world=1, overrides=MOE, last_step=2)), runs(Job(world=2, overrides=MOE, last_step=2))
    assert all(math.isfinite(loss) for loss in two.losses.values()) and len(two.losses) == 2
    assert _relative(two.losses, one.losses) <= RELATIVE_TOLERANCE, (two.losses, one.losses)


@pytest.mark.slow
def test_the_tiny_moe_model_trains_in_a_two_stage_pipeline(runs: Runs) -> None:
    """DeepSeek-V3's decoder layers (its dense first layer on stage 0, MoE layers on both) under 1F1B."""
    one = runs(Job(world=1, overrides=MOE, last_step=2))
    pipelined = runs(Job(world=2, pp=2, overrides=MOE, last_step=2))
    assert _relative(pipelined.losses, one.losses) <= RELATIVE_TOLERANCE, (pipelined.losses, one.losses)
    assert _relative(pipelined.grad_norms, one.grad_norms) <= RELATIVE_TOLERANCE


@pytest.mark.parametrize(
    ("param_groups", "flattened"),
    [
        pytest.param([{"lr": 1e-3, "params": ["model.norm.weight"]}], False, id="nested-before-pipeline-stages"),
        pytest.param({"model.norm.weight": {"lr": 1e-3}}, True, id="per-parameter-name"),
    ],
)
def test_the_optimizers_format_is_read_from_the_save(param_groups: Any, flattened: bool, tmp_path: Path) -> None:
    """A save of the first torchtitan backend (its optimizer one nested state dict) still resumes: the loader
    tells it from torchtitan's per-parameter format by the keys DCP stored."""
    import torch
    import torch.distributed.checkpoint as dcp

    from lmspec.runtime.train.torchtitan.trainer import _optimizer_flattened

    state = {"optimizer": {"state": {"model.norm.weight": {"exp_avg": torch.zeros(2)}}, "param_groups": param_groups}}
    with pytest.warns(UserWarning, match="single process"):
        dcp.save(state, checkpoint_id=str(tmp_path), no_dist=True)
    assert _optimizer_flattened(tmp_path) is flattened
