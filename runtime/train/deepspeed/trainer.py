"""DeepSpeed backend: a transformers causal LM built from the spec, ZeRO from ds_config.json.

The model is built from `model.*` alone (no download), as the transformers class of
`model.family` (lmspec.compiler.families). `deepspeed.initialize` gets the build's
emitted `ds_config.json` unchanged (ZeRO stage, precision, optimizer, gradient accumulation,
clipping) and the spec's learning-rate schedule as a client scheduler (`.lr_schedule`: DeepSpeed's own
cannot run it). `eval_loss` runs the engine in eval mode without gradients.
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
import torch.nn.functional as F

from lmspec.compiler.build.files import DEEPSPEED_DIR
from lmspec.compiler.capabilities import TABLE, target_of
from lmspec.compiler.families import FAMILIES
from lmspec.compiler.plan import Plan
from lmspec.compiler.spec.sections import ModelSpec, TrainingSpec
from lmspec.runtime.compat.deepspeed import no_cpu_shm_op_build
from lmspec.runtime.train.data import Batch
from lmspec.runtime.train.deepspeed.activation_checkpointing import enable_activation_checkpointing
from lmspec.runtime.train.deepspeed.cpu_adam import with_available_optimizer
from lmspec.runtime.train.deepspeed.lr_schedule import SpecSchedule
from lmspec.runtime.train.saving import Staged

logger = logging.getLogger(__name__)

DS_TAG = "state"


def hf_config(spec: TrainingSpec) -> Any:
    """The transformers config this trainer builds its model from, with the attention kernel
    `train.flash_attention` asks for (eager stores the s x s scores the memory model then counts)."""
    return transformers_config(spec.model, "sdpa" if spec.train.flash_attention else "eager")


def transformers_config(m: ModelSpec, attn_implementation: str) -> Any:
    """The family's config.json (lmspec.compiler.families, what the converted checkpoint carries)
    as a transformers config for training: no KV cache. Its model_type picks the family's class."""
    import transformers

    config = FAMILIES[m.family].hf_config(m) | {"use_cache": False}
    config.pop("architectures")
    return transformers.AutoConfig.for_model(**config, attn_implementation=attn_implementation)


class DeepSpeedTrainer:
    def __init__(self, spec: TrainingSpec, plan: Plan, ds_config: dict[str, Any]) -> None:
        """`ds_config`: the build's ds_config.json, as compiled (lmspec.runtime.train.loop reads it through Build)."""
        import deepspeed
        import transformers

        with no_cpu_shm_op_build():
            deepspeed.init_distributed(dist_backend=dist.get_backend())
        self.spec = spec
        self.micro_batch_size = plan.trained().batch.micro_batch_size
        self.num_micro_batches = plan.trained().batch.grad_accum_steps
        self.dp_rank, self.dp_size = dist.get_rank(), dist.get_world_size()
        model = transformers.AutoModelForCausalLM.from_config(hf_config(spec), dtype=torch.float32)
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
            loss, tokens = self._loss(batch, "mean")
            self.engine.backward(loss)
            self.engine.step()
            totals += torch.tensor([float(loss.detach()) * tokens, tokens], dtype=torch.float64)
        grad_norm = self.engine.get_global_grad_norm()
        return self._dp_mean(totals), float(grad_norm) if grad_norm is not None else math.nan, used_lr

    def eval_loss(self, batches: list[Batch]) -> float:
        """The mean token loss of these micro-batches over all DP ranks, no gradients, dropout off."""
        totals = torch.zeros(2, dtype=torch.float64)
        self.engine.eval()
        try:
            with torch.no_grad():
                for batch in batches:
                    loss_sum, tokens = self._loss(batch, "sum")
                    totals += torch.tensor([float(loss_sum), tokens], dtype=torch.float64)
        finally:
            self.engine.train()
        return self._dp_mean(totals)

    def _loss(self, batch: Batch, reduction: str) -> tuple[torch.Tensor, int]:
        """Next-token cross-entropy of one micro-batch (`reduction` over its tokens) and its token count."""
        tokens, labels = batch.tokens.to(self.device), batch.labels.to(self.device)
        logits = self.engine(input_ids=tokens).logits
        loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), labels.view(-1), reduction=reduction)
        return loss, labels.numel()

    def _dp_mean(self, totals: torch.Tensor) -> float:
        """(loss sum, tokens) summed over the DP ranks, as their token-weighted mean."""
        totals = totals.to(self.device)
        dist.all_reduce(totals)
        return float(totals[0] / totals[1])

    def save(self, directory: Path) -> Staged:
        """Written here, synchronously (DeepSpeed's engine offers no asynchronous save lmspec can use:
        compiler/capabilities.py); its files are digested at the commit, read back once."""
        self.engine.save_checkpoint(str(directory / DEEPSPEED_DIR), tag=DS_TAG)
        return Staged()

    def load(self, directory: Path) -> None:
        path, _ = self.engine.load_checkpoint(str(directory / DEEPSPEED_DIR), tag=DS_TAG)
        if path is None:
            raise RuntimeError(f"DeepSpeed could not load {directory / DEEPSPEED_DIR}")

    def init_from(self, directory: Path) -> None:
        lacks = TABLE[target_of(self.spec)].lacks["init_from"]
        raise NotImplementedError(f"train.init_from with train.backend=deepspeed: {lacks}; set train.init_from=null")

    def rng_state(self) -> dict[str, Any]:
        return {}

    def set_rng_state(self, state: dict[str, Any]) -> None:
        return None

    def close(self) -> None:
        return None
