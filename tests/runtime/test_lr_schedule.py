"""One learning-rate schedule for both backends (compiler/models/lr_schedule.py's `lr_at`).

The Megatron trainer steps megatron-core's own OptimizerParamScheduler, built from megatron/config.json,
to each optimizer step; the DeepSpeed trainer gives DeepSpeed's engine a client scheduler, which the engine
steps after every optimizer step. Both are held to `lr_at` here, step by step, on every decay and the edges
of the warm-up; the real two-rank runs of each backend (tests/runtime/test_resume.py,
tests/runtime/test_deepspeed.py) check the rates their metrics record against it too.
"""

from __future__ import annotations

import pytest
import torch

from lmspec.compiler.backends.megatron_config import megatron_config
from lmspec.compiler.models.lr_schedule import lr_at
from lmspec.compiler.pipeline import make_plan
from lmspec.runtime.train.lr_schedule import SpecSchedule
from lmspec.runtime.train.megatron.config import param_scheduler

SCHEDULES = [
    pytest.param(decay, warmup, steps, id=f"{decay}-warmup{warmup}-steps{steps}")
    for decay in ("cosine", "linear", "constant")
    for warmup, steps in ((5, 30), (0, 12), (1, 7), (9, 9), (12, 9))
]


def _train(decay: str, warmup: int, steps: int):
    overrides = [f"train.lr_schedule.decay={decay}", f"train.lr_schedule.warmup_steps={warmup}", f"train.steps={steps}"]
    plan = make_plan([*overrides, "train.checkpoint.interval=1"], None)
    return plan, plan.trained().spec.train


def _optimizer() -> torch.optim.Optimizer:
    return torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], lr=1.0)


def test_warmup_then_cosine_to_min_lr() -> None:
    _, train = _train("cosine", 5, 30)
    opt = train.optimizer
    assert lr_at(train, 1) == pytest.approx(opt.lr / 5)
    assert lr_at(train, 5) == pytest.approx(opt.lr)
    assert lr_at(train, 30) == pytest.approx(opt.min_lr)
    assert opt.min_lr < lr_at(train, 17) < opt.lr


@pytest.mark.parametrize(("decay", "warmup", "steps"), SCHEDULES)
def test_megatron_cores_scheduler_from_the_build_runs_the_schedule_exactly(decay: str, warmup: int, steps: int) -> None:
    """As the trainer steps it: to optimizer step k before step k runs, also straight to it after a resume."""
    plan, train = _train(decay, warmup, steps)
    optimizer = _optimizer()
    scheduler = param_scheduler(megatron_config(plan), optimizer)
    for step in range(1, steps + 1):
        scheduler.step(step - scheduler.num_steps)
        assert optimizer.param_groups[0]["lr"] == lr_at(train, step), step
        assert scheduler.get_lr({}) == lr_at(train, step)
    resumed = param_scheduler(megatron_config(plan), _optimizer())
    resumed.step(steps - resumed.num_steps)
    assert resumed.get_lr({}) == lr_at(train, steps)


@pytest.mark.parametrize(("decay", "warmup", "steps"), SCHEDULES)
def test_deepspeeds_client_scheduler_runs_the_schedule_exactly(decay: str, warmup: int, steps: int) -> None:
    """As DeepSpeed's engine drives a client scheduler: made over the optimizer, stepped after each optimizer
    step; a resumed one (load_state_dict of what a checkpoint saved) goes on where it stopped."""
    _, train = _train(decay, warmup, steps)
    optimizer = _optimizer()
    scheduler = SpecSchedule(optimizer, train)
    saved = None
    for step in range(1, steps + 1):
        assert optimizer.param_groups[0]["lr"] == lr_at(train, step), step
        optimizer.step()
        scheduler.step()
        if step == steps // 2:
            saved = scheduler.state_dict()
    assert saved is not None and "train" not in saved  # a checkpoint keeps the count, not the spec
    resumed_optimizer = _optimizer()
    resumed = SpecSchedule(resumed_optimizer, train)
    resumed.load_state_dict(saved)
    resumed.step()  # DeepSpeed's load restores the optimizer's rate; one more step reaches the next one
    assert resumed_optimizer.param_groups[0]["lr"] == lr_at(train, steps // 2 + 2)
