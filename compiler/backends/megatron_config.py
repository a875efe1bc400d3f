"""megatron/config.json: every megatron-core setting the Megatron backend builds its objects from.

The runtime (runtime/train/megatron/config.py) constructs megatron-core's TransformerConfig, GPTModel,
parallel groups, DistributedDataParallelConfig, OptimizerConfig and OptimizerParamScheduler from this
document alone, so a reviewer reads what will run, as ds_config.json does for DeepSpeed. It holds JSON
values only; three kinds of value name an object the runtime looks up:

- `activation_func`: a function of torch.nn.functional ("silu");
- `params_dtype`, `pipeline_dtype`: a torch dtype ("float32", "bfloat16");
- `attention_backend`: a member of megatron.core.transformer.enums.AttnBackend ("auto", "unfused").

Two settings depend on the machine that runs, not on the spec, and the runtime decides them at start-up
as Megatron-LM's arguments.py does: `gradient_accumulation_fusion` falls back to off where APEX's
fused weight-gradient kernel is not installed, and `use_cpu_initialization` is on where no GPU is.

Sections: `transformer_config` (the architecture and implementation settings), `parallel` (the
TransformerConfig's parallel degrees at the Plan's layout; a one-process model, as verify builds,
leaves them out), `gpt_model` (GPTModel's arguments), `parallel_state` (initialize_model_parallel's),
`ddp`, `optimizer`, `scheduler` (compiler/models/lr_schedule.py's owner of the schedule).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lmspec.compiler.backends.megatron import grad_reduce_in_fp32
from lmspec.compiler.families import FAMILIES
from lmspec.compiler.models.dims import chunk_layers
from lmspec.compiler.models.lr_schedule import megatron_scheduler
from lmspec.compiler.models.units import PRECISION_DTYPE

if TYPE_CHECKING:
    from lmspec.compiler.plan import Layout, Plan
    from lmspec.compiler.spec.sections import ModelSpec, TrainingSpec

# train.fp8_recipe -> (TransformerConfig.fp8, .fp8_recipe), as Megatron-LM's --fp8-format/--fp8-recipe
# pair them: delayed scaling keeps e5m2 for gradients (hybrid); per-block scales use e4m3 throughout.
# The amax history and margin stay at Megatron-LM's defaults (TransformerConfig's: 1, most_recent, 0).
FP8_SETTINGS: dict[str, tuple[str, str]] = {"delayed": ("hybrid", "delayed"), "blockwise": ("e4m3", "blockwise")}
CP_COMM_TYPE = "p2p"  # Megatron-LM's --cp-comm-type default: KV chunks passed round a ring, overlapped
INIT_METHOD_STD = 0.02  # Megatron-LM's --init-method-std default

# Megatron-LM's default bucket when --ddp-bucket-size is unset: at least 40M elements, and 1M per
# data-parallel rank (DP x CP) so each rank's share of a ring reduce stays bandwidth-bound.
MIN_BUCKET_ELEMENTS = 40_000_000
BUCKET_ELEMENTS_PER_DP_RANK = 1_000_000


@dataclass(frozen=True)
class ParallelDegrees:
    """The model-parallel degrees a model is built for: the Plan's Layout in training (`of`), or any
    degrees a test measures at (the last of a layout's stages: compiler/models/dims.py)."""

    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    etp: int = 1
    sequence_parallel: bool = False
    stage_layers: tuple[int, ...] | None = None
    virtual_stages: int | None = None  # model chunks per pipeline rank (interleaved 1F1B)

    @classmethod
    def of(cls, layout: Layout) -> ParallelDegrees:
        return cls(
            tp=layout.tp,
            pp=layout.pp,
            cp=layout.cp,
            ep=layout.ep,
            etp=layout.etp,
            sequence_parallel=layout.sequence_parallel,
            stage_layers=layout.stage_layers,
            virtual_stages=layout.virtual_stages,
        )


def bucket_elements(dp: int, cp: int) -> int:
    return max(MIN_BUCKET_ELEMENTS, BUCKET_ELEMENTS_PER_DP_RANK * dp * cp)


def pipeline_layout(
    stage_layers: tuple[int, ...], virtual_stages: int | None = None, mtp_layers: int = 0
) -> list[list[str]]:
    """Megatron's per-chunk layer list (pp x virtual stages entries, compiler.models.dims.chunk_layers):
    the embedding in the first chunk, the MTP layers and the loss in the last (with a layout megatron
    builds MTP only where the layout names it)."""
    chunks = chunk_layers(stage_layers, virtual_stages)
    last = len(chunks) - 1
    return [
        (["embedding"] if i == 0 else []) + ["decoder"] * n + (["mtp"] * mtp_layers + ["loss"] if i == last else [])
        for i, n in enumerate(chunks)
    ]


def implementation_settings(spec: TrainingSpec) -> dict[str, Any]:
    """The TransformerConfig settings of `train.transformer_impl`.

    local: no fusions (megatron-core's pure-PyTorch layers; several fused kernels need CUDA).
    transformer_engine: what Megatron-LM sets by default with --transformer-impl transformer_engine
    (arguments.py): bias-dropout, RoPE, masked-softmax and persistent-layer-norm fusion, gradient-
    accumulation fusion (where its kernel is installed: the runtime decides), TE's fused/flash attention
    chosen by TE (`auto`; unfused where train.flash_attention=false, so the s x s scores are stored as
    priced), grouped-GEMM experts where the capability table runs them, context parallelism over p2p,
    and FP8 from train.precision=fp8 with train.fp8_recipe. RoPE fusion is off for MLA: megatron-core
    0.16.1 fuses MLA's RoPE only for YaRN, and lmspec's MLA uses plain RoPE.
    """
    from lmspec.compiler.capabilities import capabilities_of  # imports the Plan, which imports the cost model

    t, m = spec.train, spec.model
    if t.transformer_impl == "local":
        return dict(
            transformer_impl="local",
            bias_dropout_fusion=False,
            apply_rope_fusion=False,
            masked_softmax_fusion=False,
            persist_layer_norm=False,
            gradient_accumulation_fusion=False,
        )
    capabilities = capabilities_of(spec)
    settings: dict[str, Any] = dict(
        transformer_impl="transformer_engine",
        attention_backend="auto" if t.flash_attention else "unfused",
        bias_dropout_fusion=True,
        apply_rope_fusion=m.attention != "mla",
        masked_softmax_fusion=True,
        persist_layer_norm=True,
        gradient_accumulation_fusion=True,
        cp_comm_type=CP_COMM_TYPE,
    )
    if m.moe is not None:
        settings["moe_grouped_gemm"] = capabilities is not None and capabilities.runs("grouped_gemm_experts")
    if t.precision == "fp8" and t.fp8_recipe is not None:
        settings["fp8"], settings["fp8_recipe"] = FP8_SETTINGS[t.fp8_recipe]
    return settings


def transformer_settings(spec: TrainingSpec) -> dict[str, Any]:
    """The TransformerConfig of `spec` but its parallel degrees: the family's architecture
    (lmspec.compiler.families), precision, recompute and implementation settings; `class` names
    megatron.core.transformer.transformer_config's class."""
    t = spec.train
    architecture = FAMILIES[spec.model.family].megatron(spec.model)
    dtype = PRECISION_DTYPE[t.precision]
    return dict(
        {"class": architecture.config_class},
        **architecture.kwargs,
        activation_func=architecture.activation,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        **implementation_settings(spec),
        # SwiGLU through megatron's bias_swiglu (Megatron-LM's --bias-swiglu-fusion default): it saves fc1's
        # output only, as compiler/models/activations.py prices it (unfused: also SiLU's output, +1/3)
        bias_activation_fusion=architecture.activation == "silu"
        and architecture.kwargs.get("gated_linear_unit", False),
        params_dtype=dtype,
        pipeline_dtype=dtype,
        bf16=dtype == "bfloat16",
        fp16=dtype == "float16",
        perform_initialization=True,
        init_method_std=INIT_METHOD_STD,
        recompute_granularity=None if t.recompute == "none" else t.recompute,
        recompute_method="uniform" if t.recompute == "full" else None,
        recompute_num_layers=1 if t.recompute == "full" else None,
        mtp_num_layers=spec.model.mtp_layers or None,  # megatron: None builds no MTP block
        mtp_loss_scaling_factor=t.mtp_loss_weight,
        # the combined 1F1B schedule: one micro-batch's all-to-alls behind another's compute (GPU only: the
        # capability table refuses it on CPU ranks, rules/overlap.py what megatron-core asserts)
        overlap_moe_expert_parallel_comm=spec.parallel.overlap.moe_a2a,
    )


def parallel_settings(spec: TrainingSpec, degrees: ParallelDegrees) -> dict[str, Any]:
    """The TransformerConfig's parallel degrees, pipeline layout and p2p settings at `degrees`."""
    d = degrees
    settings: dict[str, Any] = dict(
        tensor_model_parallel_size=d.tp,
        pipeline_model_parallel_size=d.pp,
        context_parallel_size=d.cp,
        expert_model_parallel_size=d.ep,
        expert_tensor_parallel_size=d.etp,
        sequence_parallel=d.sequence_parallel and d.tp > 1,
    )
    if d.pp > 1 and d.stage_layers is not None:
        settings["pipeline_model_parallel_layout"] = pipeline_layout(
            d.stage_layers, d.virtual_stages, spec.model.mtp_layers
        )
        settings["virtual_pipeline_model_parallel_size"] = d.virtual_stages
    if d.virtual_stages is not None:
        # Megatron-LM's interleaved default: unbatched p2p ops, even/odd ordered. Batched, the steady state's
        # send to the previous and to the next stage are one rank at pp=2 and arrive swapped (equal shapes).
        settings.update(overlap_p2p_comm=True, batch_p2p_comm=False)
    return settings


def rope_scaling_settings(m: ModelSpec) -> dict[str, Any]:
    """GPTModel's arguments for `model.rope_scaling` on GQA attention: llama3 as megatron-core's
    `rope_scaling` (band limits fixed; rule megatron_rope_scaling_runs), linear as position interpolation.
    MLA's YaRN goes through its MLATransformerConfig (lmspec.compiler.families.megatron)."""
    rs = m.rope_scaling
    if rs is None or m.attention != "gqa":
        return {}
    if rs.type == "llama3":
        return {"rope_scaling": True, "rope_scaling_factor": rs.factor}
    assert rs.type == "linear", "rule megatron_rope_scaling_runs refuses yarn with GQA attention"
    return {"seq_len_interpolation_factor": rs.factor}


def gpt_model_settings(spec: TrainingSpec) -> dict[str, Any]:
    """GPTModel's arguments but its config, layer specs and stage (the runtime's per chunk)."""
    m = spec.model
    return dict(
        vocab_size=m.vocab_size,
        max_sequence_length=spec.train.seq_length,
        share_embeddings_and_output_weights=m.tie_embeddings,
        position_embedding_type="rope",
        rotary_base=int(m.rope_theta),
        **rope_scaling_settings(m),
    )


def model_settings(spec: TrainingSpec, degrees: ParallelDegrees) -> dict[str, Any]:
    """What a GPTModel needs: its config (without degrees where all are one) and its arguments."""
    return {
        "transformer_config": transformer_settings(spec),
        "parallel": parallel_settings(spec, degrees),
        "gpt_model": gpt_model_settings(spec),
    }


def ddp_settings(spec: TrainingSpec, layout: Layout) -> dict[str, Any]:
    """megatron-core's DistributedDataParallelConfig. `parallel.overlap` decides Megatron-LM's fast path
    (training.py get_model, arguments.py): gradient reduce-scatter overlapped with the backward pass,
    bucketed (`grad_reduce`), and with the distributed optimizer the parameter all-gather overlapped with
    the next forward (`param_gather`: forward pre-hooks; so the trainer syncs parameters before it saves
    them). Without grad_reduce the gradients are reduced in one bucket after the backward. Both run on
    gloo too (CPU ranks), with the same losses."""
    overlap = spec.parallel.overlap
    return dict(
        grad_reduce_in_fp32=grad_reduce_in_fp32(spec.train.precision),
        overlap_grad_reduce=overlap.grad_reduce,
        overlap_param_gather=overlap.param_gather and layout.distributed_optimizer,
        use_distributed_optimizer=layout.distributed_optimizer,
        bucket_size=bucket_elements(layout.dp, layout.cp) if overlap.grad_reduce else None,
    )


def optimizer_settings(spec: TrainingSpec, layout: Layout) -> dict[str, Any]:
    """megatron-core's OptimizerConfig (Adam covers adam and adamw: megatron-core's Adam decouples weight
    decay, as AdamW does); its lr and min_lr are the schedule's, which the scheduler sets every step."""
    t = spec.train
    opt = t.optimizer
    dtype = PRECISION_DTYPE[t.precision]
    return dict(
        optimizer="sgd" if opt.name == "sgd" else "adam",
        lr=opt.lr,
        min_lr=opt.min_lr,
        weight_decay=opt.weight_decay,
        adam_beta1=opt.beta1,
        adam_beta2=opt.beta2,
        adam_eps=opt.eps,
        clip_grad=t.grad_clip,
        bf16=dtype == "bfloat16",
        fp16=dtype == "float16",
        params_dtype=dtype,
        use_distributed_optimizer=layout.distributed_optimizer,
    )


def parallel_state_settings(spec: TrainingSpec, layout: Layout) -> dict[str, Any]:
    """megatron.core.parallel_state.initialize_model_parallel's arguments; megatron-core's groups otherwise
    wait 30 min on a silent peer, whatever the default group's timeout."""
    return dict(
        tensor_model_parallel_size=layout.tp,
        pipeline_model_parallel_size=layout.pp,
        virtual_pipeline_model_parallel_size=layout.virtual_stages,
        context_parallel_size=layout.cp,
        expert_model_parallel_size=layout.ep,
        expert_tensor_parallel_size=layout.etp,
        distributed_timeout_minutes=spec.cluster.nccl.timeout_minutes,
    )


def megatron_config(plan: Plan) -> dict[str, Any]:
    """The whole document of a Megatron build (see the module docstring)."""
    trained = plan.trained()
    spec, layout = trained.spec, trained.layout
    return {
        **model_settings(spec, ParallelDegrees.of(layout)),
        "parallel_state": parallel_state_settings(spec, layout),
        "ddp": ddp_settings(spec, layout),
        "optimizer": optimizer_settings(spec, layout),
        "scheduler": megatron_scheduler(spec.train),
    }
