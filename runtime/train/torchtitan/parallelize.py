"""TP and FSDP2 on a transformers causal LM, as torchtitan's `apply_tp`, `apply_ac` and `apply_fsdp` apply them.

The device mesh is torchtitan's ParallelDims mesh without pipeline and context parallelism:
("dp_replicate", "dp_shard", "tp") of shape (R, S, T), each of dp_replicate and tp only where its degree is
above 1 (HSDP: shard within a group of S ranks, all-reduce across the R groups). TP is innermost, so a TP
group is T consecutive ranks, which read the same micro-batches (`data_parallel_rank`). Tensor parallelism
comes first (`.tensor_parallel`: it splits each weight over the "tp" dimension and turns every parameter into
a DTensor there); then full activation checkpointing wraps each decoder layer in checkpoint_wrapper, so the
recomputed forward gathers its layer's weights again (torchtitan's order); then each decoder layer is one FSDP
unit and the root (embeddings, final norm, head) another, sharded over the data-parallel dimensions of the
same mesh, with the job's MixedPrecisionPolicy and reshard_after_forward.

Gradient division is left to FSDP2's default (the mean over the data-parallel ranks): torchtitan's
`set_gradient_divide_factor` makes FSDP2 reduce with PREMUL_SUM, which gloo does not have.
"""

from __future__ import annotations

import torch
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from lmspec.runtime.train.torchtitan.job_config import DTYPES, JobConfig
from lmspec.runtime.train.torchtitan.tensor_parallel import apply_tp

TP = "tp"  # the mesh dimension tensor parallelism splits over; every other dimension is data-parallel


def layout_problems(config: JobConfig, world_size: int, micro_batch_size: int, grad_accum_steps: int) -> list[str]:
    """Why the document's degrees and batch cannot run on `world_size` ranks with the plan's micro-batch and
    accumulation (every factor and where it came from), or nothing."""
    p, t = config.parallelism, config.training
    problems = [
        f"parallelism.{name}={value}: this trainer runs data and tensor parallelism only (1)"
        for name, value in (
            ("pipeline_parallel_degree", p.pipeline_parallel_degree),
            ("context_parallel_degree", p.context_parallel_degree),
        )
        if value != 1
    ]
    if not p.disable_loss_parallel:
        problems.append("parallelism.disable_loss_parallel=false: this trainer gathers the logits whole (true)")
    if p.enable_async_tensor_parallel:
        problems.append("parallelism.enable_async_tensor_parallel=true: this trainer runs eagerly (false)")
    if p.dp * p.tensor_parallel_degree != world_size:
        problems.append(
            f"data_parallel_replicate_degree({p.data_parallel_replicate_degree}) * "
            f"data_parallel_shard_degree({p.data_parallel_shard_degree}) * "
            f"tensor_parallel_degree({p.tensor_parallel_degree}) != WORLD_SIZE({world_size})"
        )
    if t.seq_len % p.tensor_parallel_degree:
        problems.append(
            f"training.seq_len({t.seq_len}) does not divide by tensor_parallel_degree({p.tensor_parallel_degree}): "
            "sequence parallelism splits it evenly"
        )
    per_step = t.local_batch_size * p.dp * grad_accum_steps
    if t.local_batch_size != micro_batch_size or per_step != t.global_batch_size:
        problems.append(
            f"training.global_batch_size({t.global_batch_size}) != training.local_batch_size({t.local_batch_size})"
            f" * dp({p.dp}) * plan.json's grad_accum_steps({grad_accum_steps}) "
            f"(plan.json's micro_batch_size={micro_batch_size})"
        )
    return problems


def world_mesh(config: JobConfig, device_type: str) -> DeviceMesh:
    """The job's mesh: ("dp_replicate", "dp_shard", "tp"), dp_replicate and tp only where above 1."""
    p = config.parallelism
    degrees = {"dp_replicate": p.data_parallel_replicate_degree, "dp_shard": p.data_parallel_shard_degree}
    degrees[TP] = p.tensor_parallel_degree
    dims = {name: degree for name, degree in degrees.items() if degree > 1 or name == "dp_shard"}
    return init_device_mesh(device_type, tuple(dims.values()), mesh_dim_names=tuple(dims))


def data_parallel_names(mesh: DeviceMesh) -> tuple[str, ...]:
    return tuple(name for name in mesh.mesh_dim_names or () if name != TP)


def data_parallel_rank(mesh: DeviceMesh) -> tuple[int, int]:
    """(rank, size) of this rank's data-parallel group: its coordinate over the data-parallel dimensions,
    row-major, the same on every rank of its TP group."""
    rank, size = 0, 1
    for name in data_parallel_names(mesh):
        width = mesh[name].size()
        rank, size = rank * width + mesh.get_local_rank(name), size * width
    return rank, size


def decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The decoder layers of a transformers causal LM (`<ForCausalLM>.model.layers` in every family lmspec
    builds: Llama, Qwen, Mixtral, DeepSeek)."""
    layers = model.get_submodule("model.layers")
    if not isinstance(layers, torch.nn.ModuleList):
        raise TypeError(f"{type(model).__name__}.model.layers is a {type(layers).__name__}, not a ModuleList")
    return layers


def parallelize(model: torch.nn.Module, config: JobConfig, mesh: DeviceMesh) -> torch.nn.Module:
    """`model` (full weights, the same on every rank, on the host or the mesh's device) split over the mesh's
    "tp" dimension where it has one, with activation checkpointing as the document asks, and sharded by FSDP2
    over its data-parallel dimensions, its shards and buffers on the mesh's device; returns it (its class now
    also an FSDPModule)."""
    t, p = config.training, config.parallelism
    layers = decoder_layers(model)
    if TP in (mesh.mesh_dim_names or ()):
        apply_tp(model, layers, mesh[TP])
    if config.activation_checkpoint.mode == "full":
        for index, layer in enumerate(layers):
            layers[index] = checkpoint_wrapper(layer)  # the RNG kept for the recompute, as any dropout needs
    policy = MixedPrecisionPolicy(
        param_dtype=DTYPES[t.mixed_precision_param], reduce_dtype=DTYPES[t.mixed_precision_reduce]
    )
    reshard = p.fsdp_reshard_after_forward != "never"
    dp = mesh[data_parallel_names(mesh)]
    for layer in layers:
        fully_shard(layer, mesh=dp, mp_policy=policy, reshard_after_forward=reshard)
    fully_shard(model, mesh=dp, mp_policy=policy, reshard_after_forward=reshard)
    return model
