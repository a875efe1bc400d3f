"""train.backend=megatron: megatron-core's GPTModel under Megatron DDP, configured by megatron/config.json.

Its targets (megatron-core's local, pure-PyTorch layers on CPU ranks or GPUs; Transformer Engine's on GPUs),
the rules megatron-core imposes beyond them, and where it differs from DeepSpeed in the cost model: the
distributed optimizer shards optimizer state, gradients are reduced in fp32 under 16-bit weights, MoE
under tensor parallelism needs sequence parallelism.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from lmspec.compiler.backends.backend import TrainingBackend
from lmspec.compiler.build.files import DIST_CKPT_DIR, MEGATRON_CONFIG, TORCH_DIST_FORMAT
from lmspec.compiler.errors import Problem, error, warning

if TYPE_CHECKING:
    from lmspec.compiler.capabilities import Feature
    from lmspec.compiler.rules.context import TrainingContext

_CPU = "megatron-core's mixed-precision optimizer and distributed optimizer accept only CUDA tensors"
_NO_USERBUFFERS = (
    "lmspec's Megatron trainer does not set up Transformer Engine's userbuffers, which Megatron-LM's "
    "--tp-comm-overlap initialises before building the model"
)
_LOCAL = "megatron-core's local (pure-PyTorch) implementation"
_ZERO = "ZeRO stages are DeepSpeed's; Megatron shards optimizer states with parallel.distributed_optimizer"
LOCAL_LACKS: dict[Feature, str] = {
    "context_parallel": f"{_LOCAL} has no context-parallel attention",
    "precision_fp8": "FP8 GEMMs come from Transformer Engine",
    "precision_fp4": "FP4 GEMMs come from Transformer Engine",
    "flash_attention": f"{_LOCAL} materialises the s x s attention scores (Transformer Engine fuses them)",
    "grouped_gemm_experts": f"{_LOCAL} runs the experts one after another (SequentialMLP)",
    "zero_1": _ZERO,
    "zero_2": _ZERO,
    "zero_3": _ZERO,
    "offload_optimizer": "optimizer offload is DeepSpeed's (ZeRO-Offload)",
    "offload_params": "parameter offload is DeepSpeed's (ZeRO-Infinity)",
    "tp_comm_overlap": _NO_USERBUFFERS,
    "moe_permute_fusion": f"the fused permutation kernels are Transformer Engine's; {_LOCAL} permutes with torch ops",
}
# what Transformer Engine's layers add to the local ones
TRANSFORMER_ENGINE_RUNS = (
    "context_parallel",
    "precision_fp8",
    "precision_fp4",
    "flash_attention",
    "grouped_gemm_experts",
    "moe_permute_fusion",
)
TRANSFORMER_ENGINE_LACKS: dict[Feature, str] = {
    k: v for k, v in LOCAL_LACKS.items() if k not in TRANSFORMER_ENGINE_RUNS
}
CPU_LACKS: dict[Feature, str] = {
    **LOCAL_LACKS,
    "precision_bf16": _CPU,
    "moe_a2a_overlap": "megatron-core's combined 1F1B schedule runs the all-to-alls on CUDA streams",
    "precision_fp16": _CPU,
    "distributed_optimizer": _CPU,
    "expert_tensor_parallel": (
        "megatron-core's token dispatcher all-gathers uneven token counts over the expert tensor-parallel "
        "group, which gloo cannot (the parity sweep's ep/etp layouts)"
    ),
    "moe_flex_dispatcher": (
        "the flex dispatcher's DeepEP and HybridEP kernels run on NVIDIA GPUs over NVLink and RDMA; CPU ranks "
        "over gloo dispatch with alltoall or allgather"
    ),
    "moe_shared_expert_overlap": "megatron-core overlaps the shared experts on a CUDA side stream",
}


def grad_reduce_in_fp32(precision: str) -> bool:
    """Megatron reduces its fp32 main gradients whenever the weights are 16-bit (Megatron-LM's
    --accumulate-allreduce-grads-in-fp32, on for bf16): what megatron/config.json's DDP section says and
    the cost model prices."""
    return precision != "fp32"


def sequence_parallel_hint(ctx: TrainingContext) -> Iterator[Problem]:
    s = ctx.spec
    dense = s.model.moe is None  # MoE under TP needs it outright (experts.moe_tensor_parallel_needs_...)
    if dense and s.parallel.tp > 1 and not s.parallel.sequence_parallel:
        yield warning(
            "parallel.sequence_parallel",
            (
                f"{ctx.show('parallel.sequence_parallel')} with {ctx.show('parallel.tp')}: activations of norms and "
                "dropout are replicated on every TP rank; parallel.sequence_parallel=true divides them by tp"
            ),
        )


# megatron-core 0.16.1's RotaryEmbedding._apply_scaling takes only the factor (GPTModel's
# rope_scaling_factor); Llama-3.1's band limits and pretraining length are its defaults, fixed.
LLAMA3_FIXED = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def rope_scaling_runs(ctx: TrainingContext) -> Iterator[Problem]:
    """The rope scaling megatron-core 0.16.1's GPTModel can apply to GQA attention: llama3 at Llama-3.1's
    fixed band (factor free) and linear (seq_len_interpolation_factor); YaRN only with MLA (DeepSeek)."""
    s, rs = ctx.spec, ctx.spec.model.rope_scaling
    if rs is None or s.model.attention != "gqa":
        return
    if rs.type == "yarn":
        yield error(
            "model.rope_scaling.type",
            (
                f"{ctx.show('model.rope_scaling.type')} with GQA attention: lmspec's megatron backend applies "
                "YaRN only to MLA attention; use train.backend=deepspeed (transformers applies it)"
            ),
        )
        return
    if rs.type != "llama3":
        return
    for name, fixed in LLAMA3_FIXED.items():
        path = f"model.rope_scaling.{name}"
        if getattr(rs, name) != fixed:
            yield error(
                path,
                (
                    f"{ctx.show(path)}: megatron-core 0.16.1 applies llama3 rope scaling only with {name}={fixed} "
                    "(RotaryEmbedding._apply_scaling fixes it); use train.backend=deepspeed for this model"
                ),
            )


def sharding_summary(zero_stage: int, distributed_optimizer: bool) -> str:
    return "Megatron distributed optimizer" if distributed_optimizer else "none (Megatron DDP)"


MEGATRON = TrainingBackend(
    name="megatron",
    targets={
        ("local", "cpu"): CPU_LACKS,
        ("local", "gpu"): LOCAL_LACKS,
        ("transformer_engine", "gpu"): TRANSFORMER_ENGINE_LACKS,
    },
    no_target={
        "transformer_engine": "Transformer Engine runs on GPUs only (NVIDIA's, and AMD Instinct through ROCm's "
        "build); set train.transformer_impl=local"
    },
    rules=(sequence_parallel_hint, rope_scaling_runs),
    emitter="lmspec.compiler.emit.megatron_config:emit_megatron_config",
    config_file=MEGATRON_CONFIG,
    trainer="lmspec.runtime.train.megatron.trainer:MegatronTrainer",
    reference_outputs="lmspec.runtime.verify:megatron_reference",
    checkpoint_dir=DIST_CKPT_DIR,
    checkpoint_format=TORCH_DIST_FORMAT,
    zero_sharding=False,
    reduces_after_backward=False,
    fsdp=False,
    gathers_after_step=False,
    hf_model_code=False,
    grad_reduce_in_fp32=grad_reduce_in_fp32,
    moe_tp_needs_sequence_parallel=True,
    one_cuda_work_queue=True,
    sharding_summary=sharding_summary,
    sharding_label=lambda zero_stage, distributed_optimizer: (
        "megatron dist-opt" if distributed_optimizer else "megatron"
    ),
    optimizer_summary=None,
    pipeline_stage_modules=False,
    hf_importer="lmspec.runtime.convert.from_hf:load_megatron",
)
