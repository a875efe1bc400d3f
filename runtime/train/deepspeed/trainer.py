"""DeepSpeed backend: a transformers causal LM built from the spec, ZeRO from ds_config.json.

The model is built from `model.*` alone (no download), as the transformers class of
`model.family` (lmspec.runtime.train.hf_model). `deepspeed.initialize` gets the build's
emitted `ds_config.json` unchanged (ZeRO stage, precision, optimizer, gradient accumulation,
clipping) and the spec's learning-rate schedule as a client scheduler (lmspec.runtime.train.lr_schedule:
DeepSpeed's own cannot run it). `eval_loss` runs the engine in eval mode without gradients.
Checkpoints use DeepSpeed's own save/load under `<step dir>/deepspeed/` (model, optimizer and
scheduler states per ZeRO rank). Two things the file asks for the runtime arranges first: the
activation checkpointing of its `activation_checkpointing` section (`.activation_checkpointing`), and
DeepSpeedCPUAdam for an offloaded Adam, or torch's where its op cannot be built (`.cpu_adam`); the run
log names the optimizer that ran.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from lmspec.compiler.build.files import DEEPSPEED_DIR
from lmspec.compiler.plan import Plan
from lmspec.compiler.spec.sections import TrainingSpec
from lmspec.runtime.compat.deepspeed import no_cpu_shm_op_build
from lmspec.runtime.train.data import Batch
from lmspec.runtime.train.deepspeed.activation_checkpointing import enable_activation_checkpointing
from lmspec.runtime.train.deepspeed.cpu_adam import with_available_optimizer
from lmspec.runtime.train.hf_model import TransformersTrainer, causal_lm, causal_lm_loss, dp_token_mean
from lmspec.runtime.train.lr_schedule import SpecSchedule
from lmspec.runtime.train.saving import Staged

logger = logging.getLogger(__name__)

DS_TAG = "state"


class DeepSpeedTrainer(TransformersTrainer):
    def __init__(self, spec: TrainingSpec, plan: Plan, ds_config: dict[str, Any]) -> None:
        """`ds_config`: the build's ds_config.json, as compiled (lmspec.runtime.train.loop reads it through Build)."""
        import deepspeed

        with no_cpu_shm_op_build():
            deepspeed.init_distributed(dist_backend=dist.get_backend())
        self.spec = spec
        self.micro_batch_size = plan.trained().batch.micro_batch_size
        self.num_micro_batches = plan.trained().batch.grad_accum_steps
        self.dp_rank, self.dp_size = dist.get_rank(), dist.get_world_size()
        model = causal_lm(spec)
        checkpointed = enable_activation_checkpointing(model, ds_config)
        ds_config, fallback = with_available_optimizer(ds_config)
        self.engine, _, _, _ = deepspeed.initialize(
            model=model,
            model_parameters=model.parameters(),
            config=ds_config,
            lr_scheduler=lambda optimizer: SpecSchedule(optimizer, spec.train),
        )
        self.device = self.engine.device
        if self.dp_rank == 0:
            if fallback:
                logger.info(f"lmspec: {fallback}")
            optimizer = type(self.engine.basic_optimizer).__name__
            recompute = "every decoder layer checkpointed" if checkpointed else "no activation checkpointing"
            logger.info(f"lmspec: deepspeed optimizer {optimizer}; {recompute}")

    def train_step(self, batches: list[Batch], step: int) -> tuple[float, float, float]:
        """Optimizer step `step`: `grad_accum_steps` micro-batches at the rate the scheduler set after the
        step before (DeepSpeed restores its count on a resume)."""
        used_lr = self.engine.get_lr()[0]
        totals = torch.zeros(2, dtype=torch.float64)
        for batch in batches:
            loss, tokens = causal_lm_loss(self.engine, batch, self.device, "mean")
            self.engine.backward(loss)
            self.engine.step()
            totals += torch.tensor([float(loss.detach()) * tokens, tokens], dtype=torch.float64)
        grad_norm = self.engine.get_global_grad_norm()
        return dp_token_mean(totals, self.device), float(grad_norm) if grad_norm is not None else math.nan, used_lr

    def evaluated_model(self) -> torch.nn.Module:
        return self.engine

    def save(self, directory: Path) -> Staged:
        """Written here, synchronously (DeepSpeed's engine offers no asynchronous save lmspec can use:
        compiler/capabilities.py); its files are digested at the commit, read back once."""
        self.engine.save_checkpoint(str(directory / DEEPSPEED_DIR), tag=DS_TAG)
        return Staged()

    def load(self, directory: Path) -> None:
        path, _ = self.engine.load_checkpoint(str(directory / DEEPSPEED_DIR), tag=DS_TAG)
        if path is None:
            raise RuntimeError(f"DeepSpeed could not load {directory / DEEPSPEED_DIR}")
