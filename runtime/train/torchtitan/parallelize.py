"""TP and FSDP2 on a transformers causal LM, as torchtitan's `apply_tp`, `apply_ac` and `apply_fsdp` apply them.

The device mesh is torchtitan's ParallelDims mesh without context parallelism: ("pp", "dp_replicate",
"dp_shard", "tp") of shape (P, R, S, T), each of pp, dp_replicate and tp only where its degree is above 1
(HSDP: shard within a group of S ranks, all-reduce across the R groups). TP is innermost, so a TP group is T
consecutive ranks, and the pipeline outermost, so a stage's ranks are consecutive too; the ranks of one TP
group and those of one pipeline read the same micro-batches (`data_parallel_rank`). Under a pipeline each
stage module (lmspec.runtime.train.torchtitan.pipeline) is parallelized alone, as torchtitan's
`pipeline_llm` applies its parallelize function to each model part. Tensor parallelism
comes first (`.tensor_parallel`: it splits each weight over the "tp" dimension and turns every parameter into
a DTensor there); then activation checkpointing wraps each decoder layer (full or per op:
lmspec.runtime.train.torchtitan.activation_checkpoint), so the recomputed forward gathers its layer's weights
again (torchtitan's order); then each decoder layer is one FSDP
unit and the root (embeddings, final norm, head) another, sharded over the data-parallel dimensions of the
same mesh, with the job's MixedPrecisionPolicy and reshard_after_forward.

Gradient division is left to FSDP2's default (the mean over the data-parallel ranks): torchtitan's
`set_gradient_divide_factor` makes FSDP2 reduce with PREMUL_SUM, which gloo does not have.
"""

from __future__ import annotations

import torch
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from lmspec.runtime.train.torchtitan.activation_checkpoint import checkpointed
from lmspec.runtime.train.torchtitan.job_config import DTYPES, JobConfig
from lmspec.runtime.train.torchtitan.tensor_parallel import apply_tp

TP, PP = "tp", "pp"  # the mesh dimensions tensor and pipeline parallelism split over; the others are data-parallel


def layout_problems(config: JobConfig, world_size: int, micro_batch_size: int, grad_accum_steps: int) -> list[str]:
    """Why the document's degrees and batch cannot run on `world_size` ranks with the plan's micro-batch and
    accumulation (every factor and where it came from), or nothing."""
    p, t = config.parallelism, config.training
    problems = []
    if p.context_parallel_degree != 1:
        problems.append(
            f"parallelism.context_parallel_degree={p.context_parallel_degree}: this trainer runs no context "
            "parallelism (1)"
        )
    if not p.disable_loss_parallel:
        problems.append("parallelism.disable_loss_parallel=false: this trainer gathers the logits whole (true)")
    if p.enable_async_tensor_parallel:
        problems.append("parallelism.enable_async_tensor_parallel=true: this trainer runs eagerly (false)")
    if p.dp * p.tensor_parallel_degree * p.pipeline_parallel_degree != world_size:
        problems.append(
            f"data_parallel_replicate_degree({p.data_parallel_replicate_degree}) * "
            f"data_parallel_shard_degree({p.data_parallel_shard_degree}) * "
            f"tensor_parallel_degree({p.tensor_parallel_degree}) * "
            f"pipeline_parallel_degree({p.pipeline_parallel_degree}) != WORLD_SIZE({world_size})"
        )
    if t.seq_len % p.tensor_parallel_degree:
        problems.append(
            f"training.seq_len({t.seq_len}) does not divide by tensor_parallel_degree({p.tensor_parallel_degree}): "
            "sequence parallelism splits it evenly"
        )
    if p.pipeline_parallel_degree > 1:
        return problems + _pipeline_problems(config, micro_batch_size, grad_accum_steps)
    per_step = t.local_batch_size * p.dp * grad_accum_steps
    if t.local_batch_size != micro_batch_size or per_step != t.global_batch_size:
        problems.append(
            f"training.global_batch_size({t.global_batch_size}) != training.local_batch_size({t.local_batch_size})"
            f" * dp({p.dp}) * plan.json's grad_accum_steps({grad_accum_steps}) "
            f"(plan.json's micro_batch_size={micro_batch_size})"
        )
    if p.module_fqns_per_model_part is not None:
        problems.append("parallelism.module_fqns_per_model_part is set without a pipeline (null)")
    return problems


def _pipeline_problems(config: JobConfig, micro_batch_size: int, grad_accum_steps: int) -> list[str]:
    """Under a pipeline the schedule runs a step's micro-batches (torchtitan: local_batch_size /
    pipeline_parallel_microbatch_size of them) and nothing accumulates outside it; 1F1B holds one stage per
    rank, Interleaved1F1B two or more."""
    p, t = config.parallelism, config.training
    problems = []
    micro = p.pipeline_parallel_microbatch_size
    if micro != micro_batch_size or t.local_batch_size != micro * grad_accum_steps:
        problems.append(
            f"training.local_batch_size({t.local_batch_size}) != pipeline_parallel_microbatch_size({micro}) * "
            f"plan.json's grad_accum_steps({grad_accum_steps}) (plan.json's micro_batch_size={micro_batch_size}): "
            "the schedule runs a step's micro-batches"
        )
    if t.local_batch_size * p.dp != t.global_batch_size:
        problems.append(
            f"training.global_batch_size({t.global_batch_size}) != training.local_batch_size({t.local_batch_size})"
            f" * dp({p.dp}): under a pipeline nothing accumulates outside the schedule"
        )
    parts = len(p.module_fqns_per_model_part or ())
    per_rank, spare = divmod(parts, p.pipeline_parallel_degree)
    looped = p.pipeline_parallel_schedule != "1F1B"
    if spare or per_rank < 1 or (per_rank == 1) == looped:
        problems.append(
            f"parallelism.module_fqns_per_model_part lists {parts} stage(s) for pipeline_parallel_degree"
            f"({p.pipeline_parallel_degree}) and pipeline_parallel_schedule={p.pipeline_parallel_schedule!r} "
            "(1F1B: one stage per rank; Interleaved1F1B: two or more per rank, as many on each)"
        )
    return problems


def world_mesh(config: JobConfig, device_type: str) -> DeviceMesh:
    """The job's mesh: ("pp", "dp_replicate", "dp_shard", "tp"), each but dp_shard only where above 1."""
    p = config.parallelism
    degrees = {PP: p.pipeline_parallel_degree, "dp_replicate": p.data_parallel_replicate_degree}
    degrees |= {"dp_shard": p.data_parallel_shard_degree, TP: p.tensor_parallel_degree}
    dims = {name: degree for name, degree in degrees.items() if degree > 1 or name == "dp_shard"}
    return init_device_mesh(device_type, tuple(dims.values()), mesh_dim_names=tuple(dims))


def data_parallel_names(mesh: DeviceMesh) -> tuple[str, ...]:
    return tuple(name for name in mesh.mesh_dim_names or () if name not in (TP, PP))


def data_parallel_rank(mesh: DeviceMesh) -> tuple[int, int]:
    """(rank, size) of this rank's data-parallel group: its coordinate over the data-parallel dimensions,
    row-major, the same on every rank of its TP group and of its pipeline."""
    rank, size = 0, 1
    for name in data_parallel_names(mesh):
        width = mesh[name].size()
        rank, size = rank * width + mesh.get_local_rank(name), size * width
    return rank, size


def decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList | torch.nn.ModuleDict:
    """The decoder layers of a transformers causal LM (`<ForCausalLM>.model.layers` in every family lmspec
    builds: Llama, Qwen, Mixtral, DeepSeek), or of a pipeline stage (a ModuleDict by global index)."""
    layers = model.get_submodule("model.layers")
    if not isinstance(layers, torch.nn.ModuleList | torch.nn.ModuleDict):
        raise TypeError(f"{type(model).__name__}.model.layers is a {type(layers).__name__}, not a ModuleList")
    return layers


def parallelize(model: torch.nn.Module, config: JobConfig, mesh: DeviceMesh) -> torch.nn.Module:
    """`model` (full weights, the same on every rank, on the host or the mesh's device; a whole causal LM or
    one pipeline stage of it) split over the mesh's "tp" dimension where it has one, with activation
    checkpointing as the document asks, and sharded by FSDP2 over its data-parallel dimensions, its shards and
    buffers on the mesh's device; returns it (its class now also an FSDPModule)."""
    t, p = config.training, config.parallelism
    layers = decoder_layers(model)
    if TP in (mesh.mesh_dim_names or ()):
        apply_tp(model, list(layers.children()), mesh[TP])
    for name, layer in list(layers.named_children()):
        setattr(layers, name, checkpointed(layer, config.activation_checkpoint.mode))
    policy = MixedPrecisionPolicy(
        param_dtype=DTYPES[t.mixed_precision_param], reduce_dtype=DTYPES[t.mixed_precision_reduce]
    )
    reshard = p.fsdp_reshard_after_forward != "never"
    dp = mesh[data_parallel_names(mesh)]
    for layer in layers.children():
        fully_shard(layer, mesh=dp, mp_policy=policy, reshard_after_forward=reshard)
    fully_shard(model, mesh=dp, mp_policy=policy, reshard_after_forward=reshard)
    return model
