"""The transformers model the trainers on transformers' modeling code build (DeepSpeed, torchtitan), and its loss.

Both build it from `model.*` alone (no download), as the transformers class of `model.family`
(lmspec.compiler.families) with the config the converter writes into config.json: one definition, so a
checkpoint of either backend names the same modules, and `lmspec verify`'s reference builds it too. Both
take the same next-token loss of it and report its token-weighted mean over the data-parallel ranks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from lmspec.compiler.capabilities import TABLE, target_of
from lmspec.compiler.families import FAMILIES
from lmspec.compiler.spec.sections import ModelSpec, TrainingSpec
from lmspec.runtime.train.data import Batch


def hf_config(spec: TrainingSpec) -> Any:
    """The transformers config a trainer builds its model from, with the attention kernel
    `train.flash_attention` asks for (eager stores the s x s scores the memory model then counts)."""
    return transformers_config(spec.model, "sdpa" if spec.train.flash_attention else "eager")


def causal_lm(spec: TrainingSpec) -> torch.nn.Module:
    """The model itself, fp32 (the master weights the trainers shard and verify's reference loads into),
    initialised from torch's generator as it stands."""
    import transformers

    model: torch.nn.Module = transformers.AutoModelForCausalLM.from_config(hf_config(spec), dtype=torch.float32)
    return model


def transformers_config(m: ModelSpec, attn_implementation: str) -> Any:
    """The family's config.json (lmspec.compiler.families, what the converted checkpoint carries)
    as a transformers config for training: no KV cache. Its model_type picks the family's class."""
    import transformers

    config = FAMILIES[m.family].hf_config(m) | {"use_cache": False}
    config.pop("architectures")
    return transformers.AutoConfig.for_model(**config, attn_implementation=attn_implementation)


def causal_lm_loss(model: Callable[..., Any], batch: Batch, device: Any, reduction: str) -> tuple[torch.Tensor, int]:
    """Next-token cross-entropy of one micro-batch (`reduction` over its tokens) and its token count."""
    tokens, labels = batch.tokens.to(device), batch.labels.to(device)
    logits = model(input_ids=tokens).logits
    loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), labels.view(-1), reduction=reduction)
    return loss, labels.numel()


def dp_token_mean(totals: torch.Tensor, device: Any) -> float:
    """(loss sum, tokens) summed over the DP ranks, as their token-weighted mean."""
    totals = totals.to(device)
    dist.all_reduce(totals)
    return float(totals[0] / totals[1])


def eval_token_mean(model: torch.nn.Module, batches: Sequence[Batch], device: Any) -> float:
    """The mean token loss of these micro-batches over all DP ranks, no gradients, dropout off."""
    totals = torch.zeros(2, dtype=torch.float64)
    model.eval()
    try:
        with torch.no_grad():
            for batch in batches:
                loss_sum, tokens = causal_lm_loss(model, batch, device, "sum")
                totals += torch.tensor([float(loss_sum), tokens], dtype=torch.float64)
    finally:
        model.train()
    return dp_token_mean(totals, device)


class TransformersTrainer:
    """What the trainers on transformers' modeling code share beside their steps and saves: the token-mean
    evaluation, no RNG of their own (the loop keeps torch's), nothing to close, and, where a trainer does not
    override them, no train.init_from and no background saves (the capability table says why)."""

    spec: TrainingSpec
    device: Any

    def evaluated_model(self) -> torch.nn.Module:
        raise NotImplementedError

    def eval_loss(self, batches: list[Batch]) -> float:
        return eval_token_mean(self.evaluated_model(), batches, self.device)

    def init_from(self, directory: Path) -> None:
        lacks = TABLE[target_of(self.spec)].lacks["init_from"]
        raise NotImplementedError(
            f"train.init_from with train.backend={self.spec.train.backend}: {lacks}; set train.init_from=null"
        )

    def async_queue(self) -> Any:
        lacks = TABLE[target_of(self.spec)].lacks["async_checkpoint"]
        raise NotImplementedError(f"train.checkpoint.async_save with train.backend={self.spec.train.backend}: {lacks}")

    def rng_state(self) -> dict[str, Any]:
        return {}

    def set_rng_state(self, state: dict[str, Any]) -> None:
        return None

    def close(self) -> None:
        return None
