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

`train.megatron.extra` (megatron-core fields lmspec has no key for, checked by rules/megatron_extra.py) is
merged last into its sections, `transformer_config`, `ddp` and `optimizer`, so a reviewer reads it here too.

Sections: `transformer_config` (the architecture, MoE training and implementation settings), `parallel` (the
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
    from lmspec.compiler.spec.sections import MegatronSection, ModelSpec, TrainingSpec

# train.fp8_recipe -> (TransformerConfig.fp8, .fp8_recipe), as Megatron-LM's --fp8-format/--fp8-recipe
# pair them: per-tensor scaling keeps e5m2 for gradients (hybrid, as Megatron-Bridge's
# bf16_with_fp8_delayed_scaling_mixed and bf16_with_fp8_current_scaling_mixed); per-block scales use e4m3
# throughout (DeepSeek-V3's blocks; Megatron-Bridge's bf16_with_mxfp8_mixed for MX blocks).
# The amax history and margin stay at Megatron-LM's defaults (TransformerConfig's: 1, most_recent, 0).
FP8_SETTINGS: dict[str, tuple[str, str]] = {
    "delayed": ("hybrid", "delayed"),
    "tensorwise": ("hybrid", "tensorwise"),
    "blockwise": ("e4m3", "blockwise"),
    "mxfp8": ("e4m3", "mxfp8"),
}
# train.fp4_recipe -> (TransformerConfig.fp4, .fp4_recipe): e2m1 elements (Megatron-Bridge's
# bf16_with_nvfp4_mixed; megatron-core's only FP4 format).
FP4_SETTINGS: dict[str, tuple[str, str]] = {"nvfp4": ("e2m1", "nvfp4")}
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
    and FP8 or FP4 from train.precision with train.fp8_recipe or train.fp4_recipe. RoPE fusion is off
    for MLA: megatron-core 0.16.1 fuses MLA's RoPE only for YaRN, and lmspec's MLA uses plain RoPE.
    """
    # imports the Plan, which imports the cost model
    from lmspec.compiler.capabilities import grouped_gemm

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
        settings["moe_grouped_gemm"] = grouped_gemm(spec)
    if t.precision == "fp8" and t.fp8_recipe is not None:
        settings["fp8"], settings["fp8_recipe"] = FP8_SETTINGS[t.fp8_recipe]
    if t.precision == "fp4" and t.fp4_recipe is not None:
        settings["fp4"], settings["fp4_recipe"] = FP4_SETTINGS[t.fp4_recipe]
    return settings


def load_balancing(spec: TrainingSpec) -> str:
    """train.moe.load_balancing, auto resolved: none with the aux-loss-free expert bias, else aux_loss."""
    asked = spec.train.moe.load_balancing
    if asked != "auto":
        return asked
    return "none" if spec.model.moe is not None and spec.model.moe.router_score_bias else "aux_loss"


def moe_settings(spec: TrainingSpec) -> dict[str, Any]:
    """How a MoE model trains (train.moe; the architecture is the family's): the dispatcher, the load
    balancing (no aux loss weight without an aux loss), the router's precision, the capacity and what is
    dropped over it, Transformer Engine's permutation fusion, the shared-expert overlap and the forced
    balance. Grouped GEMM is an implementation setting (`implementation_settings`). {} for a dense model."""
    m, moe = spec.model.moe, spec.train.moe
    if m is None:
        return {}
    balancing = load_balancing(spec)
    settings: dict[str, Any] = dict(
        moe_token_dispatcher_type=moe.dispatcher,
        moe_router_load_balancing_type=balancing,
        moe_aux_loss_coeff=0.0 if balancing == "none" else moe.aux_loss_coeff,
        moe_router_dtype=moe.router_dtype,
        moe_expert_capacity_factor=moe.capacity_factor,
        moe_permute_fusion=moe.permute_fusion,
        moe_shared_expert_overlap=moe.shared_expert_overlap,
        moe_router_force_load_balancing=moe.force_balance,
    )
    if moe.dispatcher == "flex":
        settings["moe_flex_dispatcher_backend"] = moe.flex_backend
    if m.router_score_bias:
        settings["moe_router_bias_update_rate"] = moe.bias_update_rate
    if moe.capacity_factor is not None:
        settings.update(moe_token_drop_policy=moe.drop_policy, moe_pad_expert_input_to_capacity=moe.pad_to_capacity)
    return settings


def extra_settings(spec: TrainingSpec, section: MegatronSection) -> dict[str, Any]:
    """train.megatron.extra's fields for one section of the document, as plain JSON values."""
    return _json(spec.train.megatron.extra.get(section, {}))


def _json(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _json(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [_json(v) for v in value]
    return value


def transformer_settings(spec: TrainingSpec) -> dict[str, Any]:
    """The TransformerConfig of `spec` but its parallel degrees: lmspec's own settings, then
    train.megatron.extra's."""
    return {**own_transformer_settings(spec), **extra_settings(spec, "transformer_config")}


def own_transformer_settings(spec: TrainingSpec) -> dict[str, Any]:
    """What lmspec writes of the TransformerConfig from its keys: the family's architecture
    (lmspec.compiler.families), MoE training, precision, recompute and implementation settings; `class`
    names megatron.core.transformer.transformer_config's class."""
    t = spec.train
    architecture = FAMILIES[spec.model.family].megatron(spec.model)
    dtype = PRECISION_DTYPE[t.precision]
    return dict(
        {"class": architecture.config_class},
        **architecture.kwargs,
        **moe_settings(spec),
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
    settings = dict(
        grad_reduce_in_fp32=grad_reduce_in_fp32(spec.train.precision),
        overlap_grad_reduce=overlap.grad_reduce,
        overlap_param_gather=overlap.param_gather and layout.distributed_optimizer,
        use_distributed_optimizer=layout.distributed_optimizer,
        bucket_size=bucket_elements(layout.dp, layout.cp) if overlap.grad_reduce else None,
    )
    return {**settings, **extra_settings(spec, "ddp")}


def optimizer_settings(spec: TrainingSpec, layout: Layout) -> dict[str, Any]:
    """megatron-core's OptimizerConfig (Adam covers adam and adamw: megatron-core's Adam decouples weight
    decay, as AdamW does); its lr and min_lr are the schedule's, which the scheduler sets every step."""
    t = spec.train
    opt = t.optimizer
    dtype = PRECISION_DTYPE[t.precision]
    settings = dict(
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
    return {**settings, **extra_settings(spec, "optimizer")}


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
