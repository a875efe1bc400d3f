"""HF -> the torchtitan backend's model: each rank's FSDP2 shards of a released HuggingFace directory.

The torchtitan backend's importer (TrainingBackend.hf_importer), run by lmspec.runtime.convert.from_hf on
every rank. Its model is transformers' class with HF module names, so most tensors load by their own names;
transformers 5 holds some fused (each MoE layer's experts as `experts.gate_up_proj` [E, 2f, h]), which a
release stores per expert. Which released tensors make a fused one, and where each element goes, is asked of
transformers' own reversal (lmspec.runtime.convert.to_hf.ReleaseForm, what save_pretrained writes) applied to
the fused tensor's element indices: the inverse of a pure rearrangement, without lmspec knowing the layout.

A rank reads one model tensor's HF tensors at a time (FP8 ones dequantised: lmspec.runtime.convert.hf_source),
and torch's set_model_state_dict (full_state_dict) cuts every rank's DTensor shard from it, so a rank holds one
full tensor beside its shards. Every model tensor must be written once; a tied output head is the embedding's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict
from torch.distributed.tensor import DTensor

from lmspec.compiler.errors import UsageError
from lmspec.runtime.convert.hf_source import HfTensors, Imported
from lmspec.runtime.convert.to_hf import ReleaseForm

TIED_HEAD = "lm_head.weight"  # transformers ties it to model.embed_tokens.weight when the config says so
_FULL = StateDictOptions(full_state_dict=True, strict=False)


def released_tensor(form: ReleaseForm, key: str, like: torch.Tensor, hf: HfTensors) -> tuple[torch.Tensor, int]:
    """The full model tensor `key` (shape and dtype of `like`) from its released HF tensors, and their bytes."""
    shape = tuple(like.shape)
    positions = form(key, torch.arange(like.numel(), dtype=torch.int64).reshape(shape))
    if list(positions) == [key]:  # held as released
        tensor = hf.get(key)
        if tuple(tensor.shape) != shape:
            raise UsageError(f"{key}: the HF directory holds {tuple(tensor.shape)}, the model {shape}")
        return tensor.to(like.dtype), tensor.numel() * tensor.element_size()
    full = torch.empty(shape, dtype=like.dtype)
    read = 0
    for name, where in positions.items():
        part = hf.get(name)
        if tuple(part.shape) != tuple(where.shape):
            raise UsageError(f"{name} (of {key}): the HF directory holds {tuple(part.shape)}, {tuple(where.shape)}")
        full.view(-1)[where.reshape(-1)] = part.reshape(-1).to(like.dtype)
        read += part.numel() * part.element_size()
    return full, read


def load_fsdp2(trainer: Any, doc: dict[str, Any], hf_dir: Path) -> Imported:
    """Every model tensor of the trainer's FSDP2 model from `hf_dir`, one at a time. Under pipeline
    parallelism a rank holds the stages its `model_parts` hold, so it reads their tensors only, each into
    the stage that has it."""
    parts: list[torch.nn.Module] = trainer.model_parts
    owner: dict[str, torch.nn.Module] = {}
    sharded: dict[str, torch.Tensor] = {}
    for part in parts:
        for key, t in get_model_state_dict(part).items():
            if isinstance(t, torch.Tensor):
                owner[key], sharded[key] = part, t
    tied = bool(doc["hf_config"].get("tie_word_embeddings"))
    form, hf = ReleaseForm(doc["hf_config"]), HfTensors(hf_dir)
    largest = 0
    for key, local in sharded.items():
        if tied and key == TIED_HEAD:
            continue
        like = torch.empty(local.shape, dtype=local.dtype, device="meta")
        full, read = released_tensor(form, key, like, hf)
        largest = max(largest, read)
        set_model_state_dict(owner[key], {key: full}, options=_FULL)
    shard = sum((t.to_local() if isinstance(t, DTensor) else t).nbytes for t in sharded.values())
    return Imported(len(sharded), largest, shard)
