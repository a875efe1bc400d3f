"""The `train` group: the training job (backend, precision, batch, optimizer and schedule) and the
parts it holds: checkpointing, data and where its metrics go."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from lmspec.compiler.backends import BackendName
from lmspec.compiler.spec import kinds
from lmspec.compiler.spec.sections.declare import Auto, FrozenMapping, JsonValue, key


@dataclass(frozen=True, kw_only=True)
class OptimizerSpec:
    """Optimizer and its hyper-parameters."""

    name: Literal["adamw", "adam", "sgd"] = key("Optimizer.", example="adamw")
    lr: float = key("Peak learning rate.", example=3e-4, exclusive_minimum=0, maximum=kinds.LR_MAX)
    min_lr: float = key("Learning rate at the end of decay.", example=3e-5, minimum=0, maximum=kinds.LR_MAX)
    weight_decay: float = key("Decoupled weight decay.", example=0.1, minimum=0, maximum=kinds.WEIGHT_DECAY_MAX)
    beta1: float = key("Adam beta1.", example=0.9, minimum=0, maximum=1)
    beta2: float = key("Adam beta2.", example=0.95, minimum=0, maximum=1)
    eps: float = key("Adam epsilon.", example=1e-8, exclusive_minimum=0, maximum=kinds.EPS_MAX)


@dataclass(frozen=True, kw_only=True)
class LrScheduleSpec:
    """Learning-rate schedule: linear warm-up, then decay to min_lr at train.steps."""

    decay: Literal["cosine", "linear", "constant"] = key("Decay after warm-up.", example="cosine")
    warmup_steps: int = key("Linear warm-up steps.", example=100, minimum=0, maximum=kinds.STEPS_MAX)


@dataclass(frozen=True, kw_only=True)
class CheckpointSpec:
    """Where and how often training state is saved."""

    dir: str = key(
        "Checkpoint directory (relative to the working directory at run time).",
        example="runs/llama3_8b/checkpoints",
        kind=kinds.PATH,
    )
    interval: int = key("Save every this many steps.", example=1000, minimum=1, maximum=kinds.STEPS_MAX)
    keep_last_k: int = key(
        "Complete checkpoints kept; older ones are deleted after a new one is complete.",
        example=3,
        minimum=1,
        maximum=kinds.KEEP_MAX,
    )
    resume: Literal["auto", "never"] = key(
        "auto = load the newest complete checkpoint when one exists.", example="auto"
    )
    async_save: bool = key(
        "Save asynchronously (Megatron-LM's --async-save: megatron-core's asynchronous distributed checkpoint "
        "with the fully parallel strategy, each data-parallel replica writing its share): training stops only "
        "to copy each rank's share to host memory (hardware.host_memory_gib), a background process writes it, "
        "and a save waits for the previous one to be persisted. train.backend=megatron; false = every rank "
        "waits for the whole write.",
        example=False,
    )


@dataclass(frozen=True, kw_only=True)
class DataSourceSpec:
    """One dataset of a weighted blend, as a pair of Megatron's --data-path (WEIGHT PREFIX)."""

    path: str = key(
        "Megatron indexed-dataset prefix: PREFIX.bin and PREFIX.idx exist (written by `lmspec data prepare`).",
        example="data/web_text_document",
        kind=kinds.PATH,
    )
    weight: float = key(
        "Sampling weight; the blend's weights are normalised to sum to 1.",
        example=0.7,
        exclusive_minimum=0,
        maximum=kinds.BLEND_WEIGHT_MAX,
    )


@dataclass(frozen=True, kw_only=True)
class DataSpec:
    """Training data: tokenizer, datasets and their train/valid/test split."""

    tokenizer: Literal["byte", "hf"] = key(
        "byte = byte-level, built offline (256 ids + specials); hf = the HuggingFace tokenizer at tokenizer_path.",
        example="byte",
    )
    tokenizer_path: str | None = key(
        "Local directory holding tokenizer.json (loaded offline, never downloaded); null with tokenizer=byte.",
        example="tokenizers/my_bpe",
        kind=kinds.PATH,
    )
    sources: list[DataSourceSpec] | None = key(
        "Weighted blend of Megatron datasets (Megatron's --data-path); null = the corpus shipped with lmspec.",
        example=[{"path": "data/web_text_document", "weight": 1.0}],
        max_items=kinds.SOURCES_MAX,
    )
    split: str = key(
        "Documents divided train,valid,test in these proportions (Megatron's --split).",
        example="949,50,1",
        kind=kinds.SPLIT,
    )


@dataclass(frozen=True, kw_only=True)
class WandbSpec:
    """Weights & Biases (Megatron-LM's --wandb-project, torchtitan's metrics.enable_wandb); offline unless asked."""

    project: str | None = key(
        "W&B project each metrics record also goes to; null = no W&B (the wandb package then need not be installed).",
        example="llama3-pretrain",
        kind=kinds.PLAIN_NAME,
    )
    mode: Literal["offline", "online"] = key(
        "offline = written under runs/<name>/wandb, no network or account (`wandb sync` uploads it later); "
        "online = sent as it trains (needs `wandb login`).",
        example="offline",
    )


@dataclass(frozen=True, kw_only=True)
class LoggingSpec:
    """Where the training metrics go besides the console and runs/<name>/metrics.jsonl."""

    tensorboard: bool = key(
        "Also write each metrics record as TensorBoard scalars under runs/<name>/tensorboard "
        "(Megatron-LM's --tensorboard-dir; needs the tensorboard package).",
        example=False,
    )
    wandb: WandbSpec = key("Weights & Biases.")


@dataclass(frozen=True, kw_only=True)
class TrainMoeSpec:
    """How a MoE model trains (model.moe is its architecture): dispatch, load balancing, capacity, kernels."""

    dispatcher: Literal["alltoall", "allgather", "flex"] = key(
        "Token dispatcher (megatron's moe_token_dispatcher_type): alltoall = tokens to their experts' ranks; "
        "allgather = every rank gathers all tokens; flex = DeepEP/HybridEP kernels (GPUs, with "
        "train.moe.flex_backend).",
        example="alltoall",
    )
    flex_backend: Literal["deepep", "hybridep"] | None = key(
        "The flex dispatcher's kernels (megatron's moe_flex_dispatcher_backend); set exactly with dispatcher=flex.",
        example="deepep",
    )
    load_balancing: Literal["aux_loss", "seq_aux_loss", "global_aux_loss", "none"] | Auto = key(
        "Load-balancing loss (megatron's moe_router_load_balancing_type): per micro-batch, per sequence "
        "(DeepSeek-V3), over the global batch, or none; auto = none with model.moe.router_score_bias "
        "(aux-loss-free), else aux_loss.",
        example="auto",
    )
    aux_loss_coeff: float = key(
        "Weight of the load-balancing loss (megatron's moe_aux_loss_coeff); used when load_balancing is an aux loss.",
        example=0.001,
        minimum=0,
        maximum=kinds.LOSS_WEIGHT_MAX,
    )
    bias_update_rate: float = key(
        "Step of the aux-loss-free expert bias per global batch (megatron's moe_router_bias_update_rate; "
        "DeepSeek-V3: 0.001); used with model.moe.router_score_bias.",
        example=0.001,
        minimum=0,
        maximum=1,
    )
    capacity_factor: float | None = key(
        "Tokens an expert takes, as a multiple of an even share (megatron's moe_expert_capacity_factor); "
        "the rest are dropped as drop_policy says. null = dropless.",
        example=1.25,
        exclusive_minimum=0,
        maximum=kinds.EXPERTS_MAX,  # at most every token to every expert
    )
    drop_policy: Literal["probs", "position"] = key(
        "Which tokens over capacity are dropped (megatron's moe_token_drop_policy): the lowest routing "
        "probabilities, or the last positions; with a capacity_factor.",
        example="probs",
    )
    pad_to_capacity: bool = key(
        "Pad each expert's input up to its capacity (megatron's moe_pad_expert_input_to_capacity); needs a "
        "capacity_factor.",
        example=False,
    )
    router_dtype: Literal["fp32", "fp64"] | None = key(
        "Precision of routing and of the weighted sum of expert outputs (megatron's moe_router_dtype); "
        "null = the model's dtype.",
        example="fp32",
    )
    permute_fusion: bool = key(
        "Transformer Engine's fused token permutation kernels (megatron's moe_permute_fusion; GPUs with "
        "train.transformer_impl=transformer_engine).",
        example=False,
    )
    grouped_gemm: bool | Auto = key(
        "All local experts in one grouped GEMM (megatron's moe_grouped_gemm); auto = wherever the training "
        "target runs it (Transformer Engine).",
        example="auto",
    )
    shared_expert_overlap: bool = key(
        "Run the shared experts while the routed tokens are dispatched (megatron's moe_shared_expert_overlap; "
        "needs shared experts and dispatcher=alltoall).",
        example=False,
    )
    force_balance: bool = key(
        "Route tokens by random logits, evenly (megatron's moe_router_force_load_balancing): a benchmark "
        "mode whose loss is no real training run's.",
        example=False,
    )
    load_imbalance: float | None = key(
        "Measured tokens per expert-parallel rank, max over mean (>= 1), for the cost model's step time; "
        "null = lmspec estimates it. Not a megatron setting.",
        example=1.3,
        minimum=1,
        maximum=kinds.RANKS_MAX,  # max over mean of ep ranks is at most ep
    )


MegatronSection = Literal["transformer_config", "ddp", "optimizer"]


@dataclass(frozen=True, kw_only=True)
class MegatronSpec:
    """megatron-core settings lmspec has no key for, reviewed in the build's megatron/config.json."""

    extra: Mapping[MegatronSection, Mapping[str, JsonValue]] = key(
        "megatron/config.json section -> {megatron-core field: value}, merged into that section last: "
        "transformer_config (TransformerConfig or MLATransformerConfig), ddp (DistributedDataParallelConfig), "
        "optimizer (OptimizerConfig). Each field and value is checked against megatron-core's dataclass; a "
        "field lmspec sets from its own keys is refused with that key. On the command line: "
        "+train.megatron.extra.transformer_config.FIELD=VALUE, or ++train.megatron.extra={...} for the whole mapping.",
        example={"transformer_config": {"moe_z_loss_coeff": 0.001}},
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "extra", FrozenMapping(self.extra))


@dataclass(frozen=True, kw_only=True)
class TrainSpec:
    """Training job."""

    backend: BackendName = key("Training framework.", example="megatron")
    transformer_impl: Literal["local", "transformer_engine"] = key(
        "Layer implementation (Megatron-LM's --transformer-impl): transformer_engine = TE's fused layers "
        "(GPU); local = pure PyTorch (megatron-core's local spec, or transformers' modeling code for deepspeed).",
        example="transformer_engine",
    )
    precision: Literal["bf16", "fp16", "fp32", "fp8", "fp4"] = key(
        "Compute precision (bf16/fp16 keep fp32 master weights; fp8 and fp4 = bf16 weights and activations "
        "with the GEMMs in FP8 or FP4 through Transformer Engine, quantized as train.fp8_recipe or "
        "train.fp4_recipe says).",
        example="bf16",
    )
    fp8_recipe: Literal["delayed", "tensorwise", "blockwise", "mxfp8"] | None = key(
        "FP8 scaling with train.precision=fp8: delayed = one scale per tensor from the amax history; "
        "tensorwise = one scale per tensor from its current amax; blockwise = 1x128 activation / 128x128 "
        "weight blocks (DeepSeek-V3; Hopper, Blackwell); mxfp8 = one power-of-two scale per 32 elements "
        "(Blackwell, CDNA4). null otherwise.",
        example="blockwise",
    )
    fp4_recipe: Literal["nvfp4"] | None = key(
        "FP4 quantization with train.precision=fp4: nvfp4 = e2m1 elements, one e4m3 scale per 16 and one "
        "fp32 scale per tensor (Blackwell). null otherwise.",
        example="nvfp4",
    )
    seq_length: int = key("Tokens per training sequence.", example=4096, minimum=1, maximum=kinds.TOKENS_MAX)
    micro_batch_size: int = key(
        "Sequences per GPU per forward/backward.", example=1, minimum=1, maximum=kinds.BATCH_MAX
    )
    global_batch_size: int = key(
        "Sequences per optimizer step across all data-parallel ranks.", example=1024, minimum=1, maximum=kinds.BATCH_MAX
    )
    recompute: Literal["none", "selective", "full"] = key("Activation recomputation.", example="selective")
    flash_attention: bool = key("Fused/flash attention kernel (does not store the s x s score matrix).", example=True)
    optimizer: OptimizerSpec = key("Optimizer.")
    lr_schedule: LrScheduleSpec = key("Learning-rate schedule.")
    grad_clip: float = key("Global gradient-norm clip; 0 = off.", example=1.0, minimum=0, maximum=kinds.GRAD_CLIP_MAX)
    steps: int = key("Optimizer steps to train.", example=1000, minimum=1, maximum=kinds.STEPS_MAX)
    seed: int = key("Random seed (model init, data order).", example=1234, minimum=0, maximum=kinds.SEED_MAX)
    log_interval: int = key(
        "Log one metrics line every this many steps.", example=10, minimum=1, maximum=kinds.STEPS_MAX
    )
    logging: LoggingSpec = key("Metrics also to TensorBoard or Weights & Biases.")
    eval_interval: int = key(
        "Validation loss every this many steps (and after the last).", example=1000, minimum=1, maximum=kinds.STEPS_MAX
    )
    eval_iters: int = key(
        "Global batches of the valid split per validation; 0 = no validation.",
        example=10,
        minimum=0,
        maximum=kinds.STEPS_MAX,
    )
    mtp_loss_weight: float = key(
        "Weight of the multi-token-prediction loss added to the LM loss (Megatron's "
        "--mtp-loss-scaling-factor; DeepSeek-V3: 0.3, then 0.1); used when model.mtp_layers > 0.",
        example=0.1,
        minimum=0,
        maximum=kinds.LOSS_WEIGHT_MAX,
    )
    moe: TrainMoeSpec = key("How a MoE model trains (unused by a dense model).")
    megatron: MegatronSpec = key("megatron-core settings lmspec has no key for (train.backend=megatron).")
    init_from: str | None = key(
        "A checkpoint step directory written by lmspec (megatron: its torch_dist/) whose model weights "
        "training starts from, at any layout; optimizer, step and data start fresh. A checkpoint to resume "
        "in train.checkpoint.dir takes precedence. null = initialise from train.seed.",
        example="runs/base/checkpoints/step_1000",
        kind=kinds.PATH,
    )
    checkpoint: CheckpointSpec = key("Checkpointing.")
    data: DataSpec = key("Training data.")
