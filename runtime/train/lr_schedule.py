"""The spec's learning-rate schedule as a torch LR scheduler, for the trainers that step one themselves.

DeepSpeed takes a client scheduler (`deepspeed.initialize(lr_scheduler=...)`) in place of one from the
config, and steps it after every optimizer step, as torch schedulers are stepped; the torchtitan trainer
steps it after its own optimizer step, as torchtitan's LRSchedulersContainer does. DeepSpeed's schedulers
cannot run lmspec's schedule (compiler/models/lr_schedule.py says why), so this one sets each step's
rate from `lr_at`, the schedule's one owner: torch's LRScheduler sets step 1's rate when it is made and
step k+1's after the k-th step.
"""

from __future__ import annotations

from typing import Any

import torch

from lmspec.compiler.models.lr_schedule import lr_at
from lmspec.compiler.spec.sections import TrainSpec


class SpecSchedule(torch.optim.lr_scheduler.LRScheduler):
    def __init__(self, optimizer: torch.optim.Optimizer, train: TrainSpec) -> None:
        self.train = train
        super().__init__(optimizer)

    def get_lr(self) -> list[float]:  # type: ignore[override]  # torch's stub returns list[float | Tensor]
        """Every group's rate for the next optimizer step, step `last_epoch + 1` counted from 1."""
        return [lr_at(self.train, self.last_epoch + 1) for _ in self.optimizer.param_groups]

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps: the step count (the schedule itself comes from the build, not the checkpoint)."""
        return {k: v for k, v in super().state_dict().items() if k != "train"}
