"""The learning-rate schedule of a spec: the one owner both training backends follow.

`train.lr_schedule` (linear warm-up from 0 over `warmup_steps`, then `decay` to `optimizer.min_lr` at
`train.steps`) gives the learning rate of every optimizer step, counted from 1. The Megatron backend
runs it through megatron-core's OptimizerParamScheduler (its settings in megatron/config.json,
`megatron_scheduler`, stepped to the optimizer step before each step), which computes exactly this
formula; the DeepSpeed backend hands DeepSpeed a LambdaLR over `lr_at` (DeepSpeed's own schedulers warm
up over at least 2 steps, start the first two optimizer steps at their floor and decay linearly to 0,
not to min_lr, so none of them can run this schedule). tests/runtime/test_lr_schedule.py holds both
upstream schedulers equal to `lr_at` step by step.
"""

from __future__ import annotations

import math
from typing import Any

from lmspec.compiler.spec.sections import TrainSpec


def lr_at(train: TrainSpec, step: int) -> float:
    """Learning rate of optimizer step `step` (1-based): linear warm-up, then decay to min_lr."""
    opt, sched, total = train.optimizer, train.lr_schedule, train.steps
    if sched.warmup_steps and step <= sched.warmup_steps:
        return opt.lr * step / sched.warmup_steps
    if sched.decay == "constant" or total <= sched.warmup_steps:
        return opt.lr
    progress = min(1.0, (step - sched.warmup_steps) / (total - sched.warmup_steps))
    shape = 0.5 * (1 + math.cos(math.pi * progress)) if sched.decay == "cosine" else 1 - progress
    return opt.min_lr + (opt.lr - opt.min_lr) * shape


def megatron_scheduler(train: TrainSpec) -> dict[str, Any]:
    """megatron-core's OptimizerParamScheduler arguments for `lr_at` (with num_steps = the optimizer step).

    It asserts warm-up < decay steps; a run that ends inside its warm-up never reaches the decay, so the
    decay then ends one step after the warm-up, past the run. Weight decay stays constant, as the spec's is.
    """
    opt, sched = train.optimizer, train.lr_schedule
    return {
        "init_lr": 0.0,
        "max_lr": opt.lr,
        "min_lr": opt.min_lr,
        "lr_warmup_steps": sched.warmup_steps,
        "lr_decay_steps": max(train.steps, sched.warmup_steps + 1),
        "lr_decay_style": sched.decay,
        "start_wd": opt.weight_decay,
        "end_wd": opt.weight_decay,
        "wd_incr_steps": train.steps,
        "wd_incr_style": "constant",
    }
