"""train.backend=torchtitan: pipeline, tensor and FSDP2 data parallelism as torchtitan applies them.

The build's torchtitan.json holds torchtitan's own job configuration (its JobConfig sections and names:
`parallelism.data_parallel_shard_degree`, `fsdp_reshard_after_forward`, `activation_checkpoint.mode`, ...).
The runtime trains it with the torch.distributed APIs torchtitan's parallelize functions call
(`parallelize_module`, `fully_shard` per decoder layer and the root, `MixedPrecisionPolicy`, DCP checkpoints)
on transformers'
modeling code: torchtitan 0.3.0's own Trainer follows the torch nightly (it calls `dist.set_timeout`, and its
default `spmd_types` sharding needs a newer `fully_shard`) and picks CUDA on a CPU host.

The sharding is FSDP2's, named by parallel.zero_stage as FSDP's documentation maps its strategies onto ZeRO's:
3 shards weights, gradients and optimizer state and frees a layer's gathered weights after its forward
(reshard_after_forward, FULL_SHARD); 2 keeps them gathered until its backward (SHARD_GRAD_OP); 0 replicates
(torchtitan's data_parallel_replicate_degree, DDP). FSDP2 has no stage that shards the optimizer alone.

parallel.tp is torchtitan's tensor_parallel_degree, which torchtitan always runs with sequence parallelism
(its `apply_tp` splits the norms along the sequence; it has no key to turn that off): the spec says so with
parallel.sequence_parallel=true, and tp > 1 without it is refused (`tensor_parallel_without_sp`). The plan
(runtime/train/torchtitan/tensor_parallel.py) covers the dense GQA layers of Llama, Mistral and Qwen; MoE blocks
and MLA attention are refused under TP (transformers' fused expert tensors and MLA's low-rank projections have
no plan here). Async TP needs torch.compile and CUDA symmetric memory: refused.

parallel.pp is torchtitan's pipeline_parallel_degree, run with torch.distributed.pipelining's schedules as
torchtitan builds them: 1F1B, or Interleaved1F1B with parallel.virtual_stages stages per rank; the split is
parallel.pp_layout's (torchtitan's module_fqns_per_model_part). Each stage is its own module, so two things
Megatron's pipeline allows are refused here (`pipeline_rules`): a stage without a decoder layer (a virtual
stage past a stage's layers, which megatron-core builds empty) and a tied embedding (torchtitan's stages
hold no shared weight; the first and last stage would each train their own copy). Its zero-bubble schedules
(InterleavedZeroBubble, ZBVZeroBubble) have no spec key to select them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from lmspec.compiler.backends.backend import TrainingBackend
from lmspec.compiler.build.files import TORCHTITAN_CONFIG, TORCHTITAN_DCP_FORMAT, TORCHTITAN_DIR
from lmspec.compiler.errors import Problem, error

if TYPE_CHECKING:
    from lmspec.compiler.capabilities import Feature
    from lmspec.compiler.rules.context import TrainingContext

_FSDP = "lmspec's torchtitan trainer (FSDP2 data parallelism on transformers' modeling code)"
_NEXT = "not in lmspec's torchtitan trainer yet (it runs pipeline, tensor and FSDP2 data parallelism)"
_NO_DISPATCHER = "transformers' MoE blocks route and loop over their experts in place: no token dispatcher"
_NO_AUX_LOSS = (
    "transformers' MoE blocks are built without router logits (output_router_logits=false): lmspec's torchtitan "
    "trainer adds no load-balancing loss"
)
LACKS: dict[Feature, str] = {
    "context_parallel": f"torchtitan's context parallelism is {_NEXT}",
    "expert_parallel": f"torchtitan's expert parallelism is {_NEXT}",
    "expert_tensor_parallel": f"torchtitan's expert parallelism is {_NEXT}",
    "tensor_parallel_without_sp": (
        "torchtitan's tensor parallelism always splits the norms and the residual stream along the sequence "
        "(apply_tp has no switch for it)"
    ),
    "moe_tensor_parallel": (
        f"torchtitan's tensor parallelism of MoE blocks (its expert tensor parallel plan) is {_NEXT}: "
        "transformers' MoE blocks keep their experts as fused tensors"
    ),
    "mla_tensor_parallel": (
        f"tensor parallelism of MLA attention (its low-rank query and key/value projections) is {_NEXT}"
    ),
    "mtp": "transformers' modeling code does not build multi-token-prediction modules",
    "precision_fp8": f"torchtitan's float8 training (torchao) is {_NEXT}",
    "precision_fp4": "torchtitan trains no FP4 GEMMs",
    "zero_1": "FSDP2 shards gradients with the optimizer state: no stage shards the optimizer alone",
    "distributed_optimizer": "the distributed optimizer is Megatron's; FSDP2 shards with parallel.zero_stage",
    "offload_optimizer": f"FSDP2's CPUOffloadPolicy is {_NEXT}",
    "offload_params": f"FSDP2's CPUOffloadPolicy is {_NEXT}",
    "grouped_gemm_experts": "transformers' MoE blocks loop over their experts",
    "tp_comm_overlap": (
        "torchtitan's async TP (parallelism.enable_async_tensor_parallel) runs in torch.compile'd regions over CUDA "
        "symmetric memory: lmspec's torchtitan trainer runs eagerly, and gloo CPU ranks have no symmetric memory"
    ),
    "moe_a2a_overlap": f"{_FSDP} has no expert parallelism",
    **dict.fromkeys(("moe_allgather_dispatcher", "moe_flex_dispatcher"), _NO_DISPATCHER),
    "moe_load_balancing_type": _NO_AUX_LOSS,
    "moe_aux_loss_coeff": _NO_AUX_LOSS,
    "moe_bias_update_rate": "transformers' modeling code keeps the expert score bias fixed (no aux-loss-free update)",
    "moe_capacity_factor": "transformers' MoE blocks are dropless: every routed token reaches its experts",
    "moe_router_dtype": "transformers' MoE blocks route in the model's dtype",
    "moe_permute_fusion": f"{_NO_DISPATCHER}, so no permutation to fuse",
    "moe_shared_expert_overlap": f"{_NO_DISPATCHER} to overlap the shared experts with",
    "moe_force_balance": "transformers' routers have no forced-balance benchmark mode",
    "precision_fp16": "FSDP2 under fp16 needs a gradient scaler (ShardedGradScaler) the trainer does not run",
}


def one_f_one_b_has_its_micro_batches(micro_batches: Any, pp: Any, virtual_stages: Any) -> Any:
    """torch's Schedule1F1B (virtual_stages 1) runs at least one micro-batch per stage. Plain arithmetic, on
    arrays of candidates in compiler/search."""
    return (virtual_stages > 1) | (micro_batches >= pp)


def stages_fill_their_chunks(shortest_stage_layers: Any, virtual_stages: Any) -> Any:
    """Every virtual stage holds a decoder layer: none is cut from a stage of fewer layers than chunks. Plain
    arithmetic, on arrays of candidates in compiler/search."""
    return virtual_stages <= shortest_stage_layers


def pipeline_rules(ctx: TrainingContext) -> Iterator[Problem]:
    """What torchtitan's stages cannot hold: every stage (virtual ones too) runs at least one decoder layer,
    and no weight is shared between the first stage and the last; and what torch's Schedule1F1B refuses: fewer
    micro-batches in a step than stages (Megatron's 1F1B runs them, with a longer bubble)."""
    from lmspec.compiler.models.dims import ParallelDims, chunk_layers, next_multiple_above, stage_layers

    s, p = ctx.spec, ctx.spec.parallel
    if p.pp == 1:
        return
    if s.model.tie_embeddings:
        yield error(
            "model.tie_embeddings",
            (
                f"{ctx.show('model.tie_embeddings')} with {ctx.show('parallel.pp')}: torchtitan's pipeline stages "
                "share no weight, so the first stage's embedding and the last stage's head would train apart; "
                "set parallel.pp=1, or train.backend=megatron (it all-reduces the tied gradients)"
            ),
        )
    dims = ParallelDims.from_spec(s)
    v = p.virtual_stages or 1
    if dims is not None and not one_f_one_b_has_its_micro_batches(dims.micro_batches, p.pp, v):
        per_step = s.train.micro_batch_size * dims.dp
        fits = next_multiple_above(s.train.global_batch_size - 1, per_step * p.pp)
        yield error(
            "train.global_batch_size",
            (
                f"torch's 1F1B schedule runs at least one micro-batch per stage ({ctx.factor('parallel.pp')}), but a "
                f"step has {dims.micro_batches} ({ctx.factor('train.global_batch_size')} / "
                f"({ctx.factor('train.micro_batch_size')} x dp({dims.dp}))); set train.global_batch_size={fits} "
                f"(a multiple of {per_step} x {p.pp}), or a smaller train.micro_batch_size"
            ),
        )
    stages = stage_layers(s)
    if stages is None:
        return  # layers_fit_pipeline says why
    shortest = min(stages)
    if not stages_fill_their_chunks(shortest, v):
        chunks = chunk_layers(stages, p.virtual_stages)
        fix = (
            f"set parallel.virtual_stages to at most {shortest} (the shortest stage's layers), or to null"
            if shortest >= 2
            else "set it to null"
        )
        yield error(
            "parallel.virtual_stages",
            (
                f"{ctx.show('parallel.virtual_stages')} splits stages of {list(stages)} layers into "
                f"{p.virtual_stages} each, leaving a stage without a decoder layer ({list(chunks)}), which "
                f"torchtitan's stages cannot run; {fix}"
            ),
        )


SHARDING_LABELS = {0: "replicated", 2: "no-reshard", 3: "full-shard"}


def sharding_summary(zero_stage: int, distributed_optimizer: bool) -> str:
    return {
        0: "FSDP2 replicated (DDP, torchtitan's data_parallel_replicate_degree)",
        2: "FSDP2 sharded, weights kept gathered from the forward to the backward (SHARD_GRAD_OP)",
        3: "FSDP2 fully sharded, reshard after forward (FULL_SHARD)",
    }[zero_stage]


TORCHTITAN = TrainingBackend(
    name="torchtitan",
    targets={("local", "cpu"): LACKS, ("local", "gpu"): LACKS},  # the same trainer, on gloo or NCCL
    no_target={
        "transformer_engine": (
            "lmspec's torchtitan trainer runs transformers' PyTorch modeling code, not Transformer Engine; "
            "set train.transformer_impl=local"
        )
    },
    rules=(pipeline_rules,),
    emitter="lmspec.compiler.emit.torchtitan_config:emit_torchtitan_config",
    config_file=TORCHTITAN_CONFIG,
    trainer="lmspec.runtime.train.torchtitan.trainer:TorchtitanTrainer",
    reference_outputs="lmspec.runtime.verify:torchtitan_reference",
    checkpoint_dir=TORCHTITAN_DIR,
    checkpoint_format=TORCHTITAN_DCP_FORMAT,
    zero_sharding=True,
    # FSDP2 reduce-scatters (or, replicated, all-reduces) each layer's gradients in its backward and gathers
    # each layer's weights in its forward
    reduces_after_backward=False,
    fsdp=True,
    gathers_after_step=False,
    hf_model_code=True,
    grad_reduce_in_fp32=lambda precision: True,  # MixedPrecisionPolicy(reduce_dtype=float32), torchtitan's default
    moe_tp_needs_sequence_parallel=False,
    one_cuda_work_queue=False,
    sharding_summary=sharding_summary,
    sharding_label=lambda zero_stage, distributed_optimizer: "torchtitan FSDP2 " + SHARDING_LABELS[zero_stage],
    optimizer_summary=None,
    pipeline_stage_modules=True,
    hf_importer="lmspec.runtime.convert.from_hf_fsdp2:load_fsdp2",
)
