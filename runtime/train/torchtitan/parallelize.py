"""FSDP2 on a transformers causal LM, as torchtitan's `apply_fsdp` and `apply_ac` apply it to its own models.

The device mesh is torchtitan's data-parallel part of ParallelDims: ("dp_replicate", "dp_shard") of shape
(R, S) when R > 1 (HSDP: shard within a group of S ranks, all-reduce across the R groups), ("dp_shard",) of
shape (S,) otherwise. Full activation checkpointing wraps each decoder layer in checkpoint_wrapper before it is
sharded, so the recomputed forward gathers its layer's weights again (torchtitan's order). Then each decoder
layer is one FSDP unit and the root (embeddings, final norm, head) another, with the job's
MixedPrecisionPolicy and reshard_after_forward.

Gradient division is left to FSDP2's default (the mean over the data-parallel ranks): torchtitan's
`set_gradient_divide_factor` makes FSDP2 reduce with PREMUL_SUM, which gloo does not have.
"""

from __future__ import annotations

import torch
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from lmspec.runtime.train.torchtitan.job_config import DTYPES, JobConfig


def layout_problems(config: JobConfig, world_size: int, micro_batch_size: int, grad_accum_steps: int) -> list[str]:
    """Why the document's degrees and batch cannot run on `world_size` ranks with the plan's micro-batch and
    accumulation (every factor and where it came from), or nothing."""
    p, t = config.parallelism, config.training
    problems = [
        f"parallelism.{name}={value}: this trainer runs data parallelism only (1)"
        for name, value in (
            ("tensor_parallel_degree", p.tensor_parallel_degree),
            ("pipeline_parallel_degree", p.pipeline_parallel_degree),
            ("context_parallel_degree", p.context_parallel_degree),
        )
        if value != 1
    ]
    if p.dp != world_size:
        problems.append(
            f"data_parallel_replicate_degree({p.data_parallel_replicate_degree}) * "
            f"data_parallel_shard_degree({p.data_parallel_shard_degree}) != WORLD_SIZE({world_size})"
        )
    per_step = t.local_batch_size * p.dp * grad_accum_steps
    if t.local_batch_size != micro_batch_size or per_step != t.global_batch_size:
        problems.append(
            f"training.global_batch_size({t.global_batch_size}) != training.local_batch_size({t.local_batch_size})"
            f" * dp({p.dp}) * plan.json's grad_accum_steps({grad_accum_steps}) "
            f"(plan.json's micro_batch_size={micro_batch_size})"
        )
    return problems


def dp_mesh(config: JobConfig, device_type: str) -> DeviceMesh:
    """The data-parallel mesh: 2-D for HSDP (replicate > 1), else 1-D over the shard ranks."""
    p = config.parallelism
    if p.data_parallel_replicate_degree > 1:
        return init_device_mesh(
            device_type,
            (p.data_parallel_replicate_degree, p.data_parallel_shard_degree),
            mesh_dim_names=("dp_replicate", "dp_shard"),
        )
    return init_device_mesh(device_type, (p.data_parallel_shard_degree,), mesh_dim_names=("dp_shard",))


def decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The decoder layers of a transformers causal LM (`<ForCausalLM>.model.layers` in every family lmspec
    builds: Llama, Qwen, Mixtral, DeepSeek)."""
    layers = model.get_submodule("model.layers")
    if not isinstance(layers, torch.nn.ModuleList):
        raise TypeError(f"{type(model).__name__}.model.layers is a {type(layers).__name__}, not a ModuleList")
    return layers


def parallelize(model: torch.nn.Module, config: JobConfig, mesh: DeviceMesh) -> torch.nn.Module:
    """`model` (full weights, the same on every rank, on the host or the mesh's device) with activation
    checkpointing as the document asks and sharded by FSDP2 over `mesh`, its shards and buffers on the mesh's
    device; returns it (its class now also an FSDPModule)."""
    t, p = config.training, config.parallelism
    layers = decoder_layers(model)
    if config.activation_checkpoint.mode == "full":
        for index, layer in enumerate(layers):
            layers[index] = checkpoint_wrapper(layer)  # the RNG kept for the recompute, as any dropout needs
    policy = MixedPrecisionPolicy(
        param_dtype=DTYPES[t.mixed_precision_param], reduce_dtype=DTYPES[t.mixed_precision_reduce]
    )
    reshard = p.fsdp_reshard_after_forward != "never"
    for layer in layers:
        fully_shard(layer, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard)
    fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard)
    return model
