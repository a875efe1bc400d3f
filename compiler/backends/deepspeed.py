"""train.backend=deepspeed: transformers' modeling code under DeepSpeed's ZeRO, configured by ds_config.json.

Data parallel only (shard with parallel.zero_stage, offload with ZeRO-Offload/Infinity); where it differs in
the cost model: ZeRO's stages shard gradients and weights and gather a layer's weights at stage 3,
gradients travel in the model's dtype, and transformers' kernels are unfused.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from lmspec.compiler.backends.backend import TrainingBackend
from lmspec.compiler.build.files import DEEPSPEED_DIR, DEEPSPEED_ZERO_FORMAT, DS_CONFIG
from lmspec.compiler.errors import Problem, error

if TYPE_CHECKING:
    from lmspec.compiler.capabilities import Feature
    from lmspec.compiler.rules.context import TrainingContext

_HF = "lmspec's DeepSpeed trainer (transformers' modeling code under ZeRO data parallelism)"
_NO_DISPATCHER = "transformers' MoE blocks route and loop over their experts in place: no token dispatcher"
_NO_AUX_LOSS = (
    "transformers' MoE blocks are built without router logits (output_router_logits=false): lmspec's DeepSpeed "
    "trainer adds no load-balancing loss"
)
LACKS: dict[Feature, str] = {
    "tensor_parallel": f"{_HF} is data parallel only (shard with parallel.zero_stage)",
    "pipeline_parallel": f"{_HF} is data parallel only (shard with parallel.zero_stage)",
    "interleaved_pipeline": f"{_HF} has no pipeline",
    "context_parallel": f"{_HF} is data parallel only",
    "expert_parallel": f"{_HF} is data parallel only",
    "expert_tensor_parallel": f"{_HF} is data parallel only",
    "sequence_parallel": f"{_HF} has no tensor parallelism to split sequences over",
    "mtp": "transformers' modeling code does not build multi-token-prediction modules",
    "precision_fp8": "FP8 GEMMs come from Transformer Engine, which transformers' modeling code does not use",
    "precision_fp4": "FP4 GEMMs come from Transformer Engine, which transformers' modeling code does not use",
    "recompute_selective": "transformers' gradient checkpointing recomputes whole layers (train.recompute=full)",
    "grouped_gemm_experts": "transformers' MoE blocks loop over their experts",
    "tp_comm_overlap": f"{_HF} has no tensor parallelism",
    "moe_a2a_overlap": f"{_HF} has no expert parallelism",
    "distributed_optimizer": "the distributed optimizer is Megatron's; DeepSpeed shards with parallel.zero_stage",
    "init_from": "it initialises from train.seed; a lmspec torch_dist checkpoint is Megatron's format",
    "async_checkpoint": (
        "DeepSpeed has no asynchronous save lmspec can configure: its Nebula engine is Azure's service, and its "
        "FastPersist decoupled writer needs the async_io op built and NVMe or GPUDirect Storage"
    ),
    **dict.fromkeys(("moe_allgather_dispatcher", "moe_flex_dispatcher"), _NO_DISPATCHER),
    "moe_load_balancing_type": _NO_AUX_LOSS,
    "moe_aux_loss_coeff": _NO_AUX_LOSS,
    "moe_bias_update_rate": "transformers' modeling code keeps the expert score bias fixed (no aux-loss-free update)",
    "moe_capacity_factor": "transformers' MoE blocks are dropless: every routed token reaches its experts",
    "moe_router_dtype": "transformers' MoE blocks route in the model's dtype",
    "moe_permute_fusion": f"{_NO_DISPATCHER}, so no permutation to fuse",
    "moe_shared_expert_overlap": f"{_NO_DISPATCHER} to overlap the shared experts with",
    "moe_force_balance": "transformers' routers have no forced-balance benchmark mode",
}
CPU_LACKS: dict[Feature, str] = {
    **LACKS,
    "precision_fp16": "DeepSpeed's CPU accelerator has fp16 kernels only where oneDNN provides them",
}


def offload_needs_zero_stage(ctx: TrainingContext) -> Iterator[Problem]:
    """DeepSpeed offloads what ZeRO partitions: optimizer states from stage 1, parameters at stage 3.
    (Offload on Megatron is refused by capability.target_runs_spec.)"""
    p = ctx.spec.parallel
    for key, needed in (("parallel.offload_optimizer", 1), ("parallel.offload_params", 3)):
        if ctx.value(key) and p.zero_stage < needed:
            yield error(key, f"{ctx.show(key)} needs parallel.zero_stage>={needed} ({ctx.show('parallel.zero_stage')})")


def sharding_summary(zero_stage: int, distributed_optimizer: bool) -> str:
    return f"DeepSpeed ZeRO stage {zero_stage}"


DEEPSPEED = TrainingBackend(
    name="deepspeed",
    targets={("local", "cpu"): CPU_LACKS, ("local", "gpu"): LACKS},
    no_target={
        "transformer_engine": (
            "lmspec's DeepSpeed trainer runs transformers' PyTorch modeling code, not Transformer Engine; "
            "set train.transformer_impl=local"
        )
    },
    rules=(offload_needs_zero_stage,),
    emitter="lmspec.compiler.emit.deepspeed_config:emit_ds_config",
    config_file=DS_CONFIG,
    trainer="lmspec.runtime.train.deepspeed.trainer:DeepSpeedTrainer",
    reference_outputs="lmspec.runtime.verify:deepspeed_reference",
    checkpoint_dir=DEEPSPEED_DIR,
    checkpoint_format=DEEPSPEED_ZERO_FORMAT,
    zero_sharding=True,
    reduces_after_backward=True,
    fsdp=False,
    gathers_after_step=True,
    hf_model_code=True,
    grad_reduce_in_fp32=lambda precision: precision == "fp32",
    moe_tp_needs_sequence_parallel=False,
    one_cuda_work_queue=False,
    sharding_summary=sharding_summary,
    sharding_label=lambda zero_stage, distributed_optimizer: f"deepspeed ZeRO-{zero_stage}",
    optimizer_summary="lmspec.compiler.emit.deepspeed_config:optimizer_summary",
    pipeline_stage_modules=False,
    hf_importer=None,
)
