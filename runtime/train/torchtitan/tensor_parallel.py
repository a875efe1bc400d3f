"""Tensor and sequence parallelism on a transformers causal LM, as torchtitan's `apply_tp` applies them to its own.

Each decoder layer (Llama, Mistral, Qwen2, Qwen3: GQA attention and a gated MLP, transformers' module names):

    input_layernorm           SequenceParallel      the residual stream stays split along the sequence, s/tp
    self_attn                 PrepareModuleInput    all-gathers its input: Shard(1) -> Replicate
    self_attn.{q,k,v}_proj    ColwiseParallel       this rank's heads (transformers views them as (-1, head_dim))
    self_attn.{q,k}_norm      SequenceParallel      Qwen3's per-head norms: replicated weights, their gradients
                                                    summed over the TP ranks' heads
    self_attn.o_proj          RowwiseParallel       reduce-scatters its output back to Shard(1)
    post_attention_layernorm  SequenceParallel
    mlp                       PrepareModuleInput    all-gather
    mlp.{gate,up}_proj        ColwiseParallel
    mlp.down_proj             RowwiseParallel       reduce-scatter

and around them the embedding vocabulary-parallel (RowwiseParallel: each rank looks up its rows), the final
norm sequence-parallel and the head column-parallel over the vocabulary, its logits gathered whole
(Replicate): torchtitan's plan with loss parallelism off (`parallelism.disable_loss_parallel`), so the loss
is transformers' cross-entropy on whole logits, as without TP.

One departure from torchtitan: its embedding reduce-scatters its output along the sequence (Shard(1)), but
transformers' model derives the position ids, the rotary embedding and the causal mask from the embedding
output's sequence length, so here the embedding all-reduces it whole and the first decoder layer keeps its
sequence shard (Replicate -> Shard(1), a slice, no communication). Every parameter becomes a DTensor on the
TP mesh (the norms Replicate), so FSDP2 then shards all of them over the data-parallel dimensions of the same
mesh and the gradient norm is taken over one 2-D mesh.

torchtitan always applies sequence parallelism with TP; so does this plan: lmspec's torchtitan backend runs
`parallel.tp` > 1 with `parallel.sequence_parallel=true` only (compiler/backends/torchtitan.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)


def _layer_plan(layer: torch.nn.Module) -> dict[str, ParallelStyle]:
    """One decoder layer's plan: the projections split, the norms along the sequence."""
    plan: dict[str, ParallelStyle] = {
        "input_layernorm": SequenceParallel(),
        "self_attn": PrepareModuleInput(
            input_kwarg_layouts={"hidden_states": Shard(1)}, desired_input_kwarg_layouts={"hidden_states": Replicate()}
        ),
        "self_attn.q_proj": ColwiseParallel(),
        "self_attn.k_proj": ColwiseParallel(),
        "self_attn.v_proj": ColwiseParallel(),
        "self_attn.o_proj": RowwiseParallel(output_layouts=Shard(1)),
        "post_attention_layernorm": SequenceParallel(),
        "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "mlp.gate_proj": ColwiseParallel(),
        "mlp.up_proj": ColwiseParallel(),
        "mlp.down_proj": RowwiseParallel(output_layouts=Shard(1)),
    }
    for norm in ("self_attn.q_norm", "self_attn.k_norm"):
        if hasattr(layer.get_submodule("self_attn"), norm.rpartition(".")[2]):
            plan[norm] = SequenceParallel(use_local_output=True)
    return plan


def apply_tp(model: torch.nn.Module, layers: Sequence[torch.nn.Module], mesh: DeviceMesh) -> None:
    """`model`'s weights split over the 1-D TP `mesh` in place, with sequence parallelism (the module
    docstring's plan); `layers`: its decoder layers. A pipeline stage holds the embedding, the final norm
    and the head only where its stage does: what it lacks is left out of the plan, and only the stage with
    the embedding cuts the first layer's sequence shard (a later stage receives its shard)."""
    root: dict[str, ParallelStyle] = {
        "model.embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()),
        "model.norm": SequenceParallel(use_local_output=True),
        "lm_head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
    }
    held = {name: style for name, style in root.items() if _holds(model, name)}
    parallelize_module(model, mesh, held)
    for layer in layers:
        parallelize_module(layer, mesh, _layer_plan(layer))
    if "model.embed_tokens" in held:  # the first layer takes its sequence shard of the whole embedding output
        parallelize_module(
            layers[0],
            mesh,
            PrepareModuleInput(input_layouts=(Replicate(),), desired_input_layouts=(Shard(1),), use_local_output=True),
        )


def _holds(model: torch.nn.Module, name: str) -> bool:
    """Whether `model` has a module at `name` (a pipeline stage sets what it does not run to None)."""
    parent, _, leaf = name.rpartition(".")
    owner = model.get_submodule(parent) if parent else model
    return getattr(owner, leaf, None) is not None
