"""Activation checkpointing of each decoder layer, as torchtitan's `apply_ac` applies it.

"full" (train.recompute=full) wraps each layer in checkpoint_wrapper: the backward reruns its whole forward.
"selective" with `selective_ac_option="op"` (train.recompute=selective) is torchtitan's per-op policy: inside
each layer the outputs of the compute-bound ops are saved (torchtitan's save list: every matmul, the fused
attention kernels, the sequence-parallel reduce-scatter, `max`), except every second matmul, which the
backward recomputes with the cheap elementwise ops around it. The count of matmuls restarts for each layer's
forward and for its recomputation, so both take the same ones. The attention kernel CPU runs
(`_scaled_dot_product_flash_attention_for_cpu`) is in the list beside the GPU kernels torchtitan names, so the
policy keeps on CPU what it keeps on a GPU. Each layer is wrapped before FSDP2 shards it, so the recomputed
forward gathers its weights again (torchtitan's order).
"""

from __future__ import annotations

from collections import defaultdict
from functools import partial
from typing import Any

import torch
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

# torchtitan's _op_sac_save_list (models/llama3/infra/parallelize.py), with the CPU attention kernel
SAVED_OPS = {
    torch.ops.aten.mm.default,
    torch.ops.aten._scaled_dot_product_efficient_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention.default,
    torch.ops.aten._scaled_dot_product_cudnn_attention.default,
    torch.ops.aten._scaled_dot_product_attention_math.default,
    torch.ops.aten._scaled_dot_product_fused_attention_overrideable.default,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
    torch.ops._c10d_functional.reduce_scatter_tensor.default,
    torch.ops.aten.max.default,
}


def _every_other_matmul(meta: dict[str, int], ctx: Any, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    """torchtitan's op policy: save what SAVED_OPS names, but recompute the 2nd, 4th, ... matmul of the pass."""
    count = f"{'recompute' if ctx.is_recompute else 'forward'}_mm_count"
    if func == torch.ops.aten.mm.default:
        meta[count] += 1
    second_mm = func == torch.ops.aten.mm.default and meta[count] % 2 == 0
    return CheckpointPolicy.MUST_SAVE if func in SAVED_OPS and not second_mm else CheckpointPolicy.PREFER_RECOMPUTE


def _op_contexts() -> Any:
    """A fresh matmul count for one checkpointed call of a layer (torchtitan's selective_checkpointing_context_fn)."""
    return create_selective_checkpoint_contexts(partial(_every_other_matmul, defaultdict(int)))


def checkpointed(layer: torch.nn.Module, mode: str) -> torch.nn.Module:
    """`layer` as activation_checkpoint.mode asks: "none" as it is, "full" or "selective" (per op) wrapped."""
    if mode == "full":
        return checkpoint_wrapper(layer)  # the RNG kept for the recompute, as any dropout needs
    if mode == "selective":
        return checkpoint_wrapper(layer, context_fn=_op_contexts)
    return layer
