"""The spec's sections as typed, frozen dataclasses.

This module is the single source of every key's name, type, bounds, description
and example: `schemas/spec.schema.json` is generated from it (`lmspec schema`),
validation checks against that schema, and after validation the rest of lmspec
holds these objects, never raw dicts. The YAML key, the attribute and the
override prefix are the same word.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from lmspec.compiler.families import FamilyName
from lmspec.compiler.spec import kinds as K
from lmspec.compiler.spec.kinds import Kind


def key(
    description: str,
    *,
    example: Any = None,
    minimum: float | None = None,
    exclusive_minimum: float | None = None,
    maximum: float | None = None,
    kind: Kind | None = None,
    max_items: int | None = None,
) -> Any:
    """Declare a spec key: its description, one example, its numeric bounds or its string kind.

    Every number needs a maximum and every string a kind (lmspec.compiler.spec.kinds); lmspec.compiler.spec.schema
    refuses to generate a schema for a key without one."""
    meta = {
        "description": description,
        "example": example,
        "minimum": minimum,
        "exclusiveMinimum": exclusive_minimum,
        "maximum": maximum,
        "kind": kind,
        "maxItems": max_items,
    }
    return field(metadata={k: v for k, v in meta.items() if v is not None})


Auto = Literal["auto"]
_S = TypeVar("_S", bound="Spec")


@dataclass(frozen=True, kw_only=True)
class MlaSpec:
    """Multi-head latent attention (DeepSeek-V2/V3): low-rank compressed K/V (and Q)."""

    q_lora_rank: int | None = key(
        "Rank of the query down-projection; null = no query compression (V2-Lite).",
        example=1536,
        minimum=1,
        maximum=K.WIDTH_MAX,
    )
    kv_lora_rank: int = key(
        "Rank of the joint key/value down-projection (the latent cached by vLLM).",
        example=512,
        minimum=1,
        maximum=K.WIDTH_MAX,
    )
    qk_nope_head_dim: int = key(
        "Per-head query/key dimension without rotary embedding.", example=128, minimum=1, maximum=K.WIDTH_MAX
    )
    qk_rope_head_dim: int = key(
        "Per-head query/key dimension carrying rotary embedding (shared key across heads).",
        example=64,
        minimum=1,
        maximum=K.WIDTH_MAX,
    )
    v_head_dim: int = key("Per-head value dimension.", example=128, minimum=1, maximum=K.WIDTH_MAX)


@dataclass(frozen=True, kw_only=True)
class MoeSpec:
    """Mixture-of-experts MLP block."""

    num_experts: int = key("Routed experts per MoE layer.", example=256, minimum=1, maximum=K.EXPERTS_MAX)
    top_k: int = key("Routed experts each token is sent to.", example=8, minimum=1, maximum=K.EXPERTS_MAX)
    num_shared_experts: int = key(
        "Always-active shared experts per MoE layer (DeepSeek); 0 for Mixtral.",
        example=1,
        minimum=0,
        maximum=K.EXPERTS_MAX,
    )
    ffn_hidden_size: int = key(
        "Intermediate size of one expert's gated MLP.", example=2048, minimum=1, maximum=K.WIDTH_MAX
    )
    first_dense_layers: int = key(
        "Leading layers that use the dense MLP instead of MoE.", example=3, minimum=0, maximum=K.LAYERS_MAX
    )
    router_score_bias: bool = key(
        "Router keeps a per-expert score-correction bias (DeepSeek-V3 aux-loss-free balancing).", example=True
    )
    router_score_function: Literal["softmax", "sigmoid"] = key(
        "How the router scores experts: softmax (Mixtral, Qwen3-MoE, DeepSeek-V2) or sigmoid (DeepSeek-V3; HF"
        " scoring_func).",
        example="sigmoid",
    )
    router_num_groups: int | None = key(
        "Expert groups of group-limited routing (HF n_group; DeepSeek-V3: 8); null = no groups.",
        example=8,
        minimum=1,
        maximum=K.EXPERTS_MAX,
    )
    router_group_topk: int | None = key(
        "Groups each token may route into (HF topk_group; DeepSeek-V3: 4); set exactly when router_num_groups is.",
        example=4,
        minimum=1,
        maximum=K.EXPERTS_MAX,
    )
    routed_scaling_factor: float = key(
        "Factor on the routed experts' combined output (HF routed_scaling_factor; DeepSeek-V3: 2.5).",
        example=2.5,
        exclusive_minimum=0,
        maximum=K.SCALE_MAX,
    )
    norm_topk_prob: bool = key(
        "Renormalise the top-k routing weights to sum to 1 (HF norm_topk_prob; DeepSeek-V2-Lite: false).",
        example=True,
    )


# The rope_scaling fields each type reads besides `factor` (HF's rope_scaling keys of that type); a spec
# leaves the others null (rule rope_scaling_fields_match_type), an import refuses them.
ROPE_SCALING_FIELDS: dict[str, tuple[str, ...]] = {
    "llama3": ("original_max_position_embeddings", "low_freq_factor", "high_freq_factor"),
    "yarn": ("original_max_position_embeddings", "beta_fast", "beta_slow", "mscale", "mscale_all_dim"),
    "linear": (),
}


@dataclass(frozen=True, kw_only=True)
class RopeScalingSpec:
    """RoPE context extension as the released config.json states it (HF `rope_scaling`); the fields a
    type does not use stay null."""

    type: Literal["llama3", "yarn", "linear"] = key(
        "llama3 (Llama-3.1's frequency-band scaling), yarn (DeepSeek's) or linear (position interpolation).",
        example="llama3",
    )
    factor: float = key("Context extension factor.", example=8.0, exclusive_minimum=0, maximum=K.SCALE_MAX)
    original_max_position_embeddings: int | None = key(
        "Context length the model was pretrained at (llama3, yarn); null for linear.",
        example=8192,
        minimum=1,
        maximum=K.TOKENS_MAX,
    )
    low_freq_factor: float | None = key(
        "llama3: wavelengths above original/low_freq_factor are scaled fully.",
        example=1.0,
        exclusive_minimum=0,
        maximum=K.SCALE_MAX,
    )
    high_freq_factor: float | None = key(
        "llama3: wavelengths below original/high_freq_factor stay unscaled.",
        example=4.0,
        exclusive_minimum=0,
        maximum=K.SCALE_MAX,
    )
    beta_fast: float | None = key(
        "yarn: fast rotation boundary.", example=32.0, exclusive_minimum=0, maximum=K.SCALE_MAX
    )
    beta_slow: float | None = key(
        "yarn: slow rotation boundary.", example=1.0, exclusive_minimum=0, maximum=K.SCALE_MAX
    )
    mscale: float | None = key("yarn: attention temperature coefficient.", example=1.0, minimum=0, maximum=K.SCALE_MAX)
    mscale_all_dim: float | None = key(
        "yarn: the temperature coefficient applied to every dimension.", example=1.0, minimum=0, maximum=K.SCALE_MAX
    )


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """Architecture of a decoder-only transformer (pre-norm, RMSNorm, SwiGLU, RoPE)."""

    name: str = key("Preset name; also the default build name.", example="llama3_8b", kind=K.PLAIN_NAME)
    family: FamilyName = key("HuggingFace architecture family used for conversion and serving.", example="llama")
    num_layers: int = key("Transformer layers.", example=32, minimum=1, maximum=K.LAYERS_MAX)
    hidden_size: int = key("Model (residual stream) width.", example=4096, minimum=1, maximum=K.WIDTH_MAX)
    ffn_hidden_size: int = key(
        "Intermediate size of the dense gated MLP.", example=14336, minimum=1, maximum=K.WIDTH_MAX
    )
    num_attention_heads: int = key("Query heads.", example=32, minimum=1, maximum=K.HEADS_MAX)
    num_kv_heads: int = key(
        "Key/value heads (GQA); equal to heads for MHA and MLA.", example=8, minimum=1, maximum=K.HEADS_MAX
    )
    head_dim: int = key(
        "Per-head query/key width; for MLA qk_nope_head_dim + qk_rope_head_dim.",
        example=128,
        minimum=1,
        maximum=K.WIDTH_MAX,
    )
    vocab_size: int = key(
        "Vocabulary size (rows of the embedding and output head).", example=128256, minimum=1, maximum=K.VOCAB_MAX
    )
    max_position_embeddings: int = key(
        "Longest sequence the positional encoding is trained for.", example=8192, minimum=1, maximum=K.TOKENS_MAX
    )
    attention: Literal["gqa", "mla"] = key(
        "Attention kind: gqa (covers MHA when kv heads = heads) or mla.", example="gqa"
    )
    mla: MlaSpec | None = key("MLA ranks; required when attention is mla, null otherwise.", example=None)
    moe: MoeSpec | None = key("Mixture-of-experts block; null for a dense model.", example=None)
    norm_eps: float = key("RMSNorm epsilon.", example=1e-5, exclusive_minimum=0, maximum=K.EPS_MAX)
    rope_theta: float = key("RoPE base frequency.", example=500000.0, exclusive_minimum=0, maximum=K.ROPE_THETA_MAX)
    rope_scaling: RopeScalingSpec | None = key(
        "RoPE context extension (Llama-3.1: llama3; DeepSeek: yarn); null = plain RoPE.", example=None
    )
    qkv_bias: bool = key("Bias on the query, key and value projections, none on the output (Qwen2).", example=False)
    qk_norm: bool = key("Per-head RMSNorm on queries and keys before RoPE (Qwen3).", example=False)
    tie_embeddings: bool = key("Output head shares the input embedding matrix.", example=False)
    mtp_layers: int = key(
        "Multi-token-prediction modules (DeepSeek-V3: 1); counted apart from the model's size.",
        example=0,
        minimum=0,
        maximum=K.LAYERS_MAX,
    )


@dataclass(frozen=True, kw_only=True)
class GpuSpec:
    """One accelerator, as its vendor datasheet states it (dense, no sparsity)."""

    name: str = key("Accelerator name.", example="H100-SXM-80GB", kind=K.LABEL)
    memory_gib: float = key(
        "Device memory in GiB as labelled (usable memory is lower; see the memory model's reserve).",
        example=80,
        exclusive_minimum=0,
        maximum=K.MEMORY_GIB_MAX,
    )
    bf16_tflops: float = key("Dense bf16 peak, TFLOP/s.", example=989, minimum=K.RATE_MIN, maximum=K.RATE_MAX)
    hbm_gb_per_s: float = key("Memory bandwidth, GB/s.", example=3350, minimum=K.RATE_MIN, maximum=K.RATE_MAX)
    fp8_tflops: float | None = key(
        "Dense FP8 tensor-core peak, TFLOP/s; null = no FP8 tensor cores (A100, CPU).",
        example=1979,
        minimum=K.RATE_MIN,
        maximum=K.RATE_MAX,
    )
    generation: Literal["ampere", "ada", "hopper", "cpu"] = key(
        "Architecture generation: picks the step-time model's GEMM and attention efficiencies calibrated on "
        "published runs of that generation (bench/steptime_published.py); ada and cpu, which no published "
        "run calibrates, take ampere's.",
        example="hopper",
    )
    sustained_fraction: float = key(
        "Share of the datasheet peaks (bf16 and fp8) the part sustains through a training run: 1.0 = its "
        "rated clocks hold (an H100 SXM at 700 W); lower where the power limit or clocks are capped below "
        "the datasheet's (Meta's Grand Teton H100 at 500 W). MFU stays quoted on the datasheet peak.",
        example=1.0,
        exclusive_minimum=0,
        maximum=1,
    )


@dataclass(frozen=True, kw_only=True)
class IntraNodeSpec:
    """Link between the GPUs of one node."""

    link: Literal["nvlink", "pcie", "shm"] = key(
        "Kind of link: NVLink, PCIe only, or host shared memory (CPU ranks).", example="nvlink"
    )
    gb_per_s: float = key(
        "Per-GPU bandwidth of the link, GB/s, as the datasheet states it.",
        example=900,
        minimum=K.RATE_MIN,
        maximum=K.RATE_MAX,
    )


@dataclass(frozen=True, kw_only=True)
class InterNodeSpec:
    """Network between nodes; drives nccl.env and the communication estimate."""

    fabric: Literal["ib", "roce", "ethernet"] = key("InfiniBand, RoCE, or plain TCP Ethernet.", example="ib")
    gbit_per_s_per_nic: float = key(
        "Line rate of one NIC, Gbit/s.", example=400, minimum=K.RATE_MIN, maximum=K.RATE_MAX
    )
    nics_per_node: int = key("NICs per node used by NCCL.", example=8, minimum=1, maximum=K.NICS_MAX)
    hca: list[str] = key(
        "RDMA devices for NCCL_IB_HCA (empty = let NCCL choose).",
        example=["mlx5_0", "mlx5_1"],
        kind=K.RDMA_DEVICE,
        max_items=K.NICS_MAX,
    )
    socket_ifname: str | None = key(
        "Interface for NCCL/gloo bootstrap and TCP traffic (NCCL_SOCKET_IFNAME); null = auto.",
        example="eth0",
        kind=K.INTERFACE,
    )


@dataclass(frozen=True, kw_only=True)
class HardwareSpec:
    """The machines a job runs on."""

    name: str = key("Hardware preset name.", example="h100_80g", kind=K.PLAIN_NAME)
    gpu: GpuSpec = key("The accelerator.")
    gpus_per_node: int = key("Accelerators (ranks) per node.", example=8, minimum=1, maximum=K.GPUS_PER_NODE_MAX)
    nodes: int = key("Nodes in the job.", example=1, minimum=1, maximum=K.NODES_MAX)
    intra_node: IntraNodeSpec = key("Link inside a node.")
    inter_node: InterNodeSpec = key("Network between nodes.")


@dataclass(frozen=True, kw_only=True)
class OverlapSpec:
    """Communication hidden behind compute, as the backends schedule it (what the step-time model and the
    runtime both read)."""

    grad_reduce: bool = key(
        "Reduce the gradients bucket by bucket while the last micro-batch's backward still runs (Megatron "
        "--overlap-grad-reduce; DeepSpeed ZeRO-1/2/3 overlap_comm); false: one reduce after the backward.",
        example=True,
    )
    param_gather: bool = key(
        "Gather sharded weights ahead of use: Megatron --overlap-param-gather (the next step's first forward "
        "hides the distributed optimizer's all-gather), DeepSpeed ZeRO-3 prefetch (stage3_prefetch_bucket_size); "
        "false: gathered when needed. Weights that are not sharded are never gathered.",
        example=True,
    )
    tp_comm: bool = key(
        "Tensor-parallel all-gathers and reduce-scatters pipelined with their GEMMs through Transformer Engine's "
        "userbuffers (Megatron --tp-comm-overlap; needs sequence parallelism).",
        example=False,
    )
    moe_a2a: bool = key(
        "Expert all-to-alls of one micro-batch hidden behind another micro-batch's compute (megatron-core's "
        "overlap_moe_expert_parallel_comm, the combined 1F1B schedule after DeepSeek-V3's DualPipe; needs "
        "parallel.ep > 1, no full recompute, and parallel.virtual_stages when parallel.pp > 1).",
        example=False,
    )


@dataclass(frozen=True, kw_only=True)
class ParallelSpec:
    """Parallel layout: world = tp x pp x dp x cp; experts sharded by ep (x etp) inside it."""

    tp: int = key("Tensor-parallel degree (must stay inside a node).", example=8, minimum=1, maximum=K.RANKS_MAX)
    pp: int = key("Pipeline-parallel stages.", example=1, minimum=1, maximum=K.RANKS_MAX)
    dp: int | Auto = key(
        "Data-parallel degree; auto = world / (tp x pp x cp).", example="auto", minimum=1, maximum=K.RANKS_MAX
    )
    cp: int = key("Context-parallel degree (sequence split across ranks).", example=1, minimum=1, maximum=K.RANKS_MAX)
    ep: int = key("Expert-parallel degree for MoE layers.", example=1, minimum=1, maximum=K.RANKS_MAX)
    etp: int = key(
        "Tensor-parallel degree inside each expert (Megatron expert_tensor_parallel_size).",
        example=1,
        minimum=1,
        maximum=K.RANKS_MAX,
    )
    sequence_parallel: bool = key(
        "Megatron sequence parallelism for norms/dropout inside the TP group (needs tp > 1).", example=False
    )
    zero_stage: Literal[0, 1, 2, 3] = key("DeepSpeed ZeRO stage (deepspeed backend).", example=1)
    distributed_optimizer: bool = key(
        "Megatron distributed optimizer: optimizer states and master weights sharded over DP.", example=False
    )
    offload_optimizer: bool = key("DeepSpeed: keep optimizer states in host memory.", example=False)
    offload_params: bool = key("DeepSpeed ZeRO-3: keep parameters in host memory.", example=False)
    pp_layout: None | Auto | list[int] = key(
        "Layers per pipeline stage: null = num_layers must divide "
        "by pp; auto = balanced uneven split; or an explicit list.",
        example="auto",
        maximum=K.LAYERS_MAX,
        max_items=K.LAYERS_MAX,
    )
    virtual_stages: int | None = key(
        "Interleaved 1F1B: model chunks per pipeline rank; null = plain 1F1B.",
        example=2,
        minimum=1,
        maximum=K.LAYERS_MAX,
    )
    overlap: OverlapSpec = key("Communication hidden behind compute.")


@dataclass(frozen=True, kw_only=True)
class OptimizerSpec:
    """Optimizer and its hyper-parameters."""

    name: Literal["adamw", "adam", "sgd"] = key("Optimizer.", example="adamw")
    lr: float = key("Peak learning rate.", example=3e-4, exclusive_minimum=0, maximum=K.LR_MAX)
    min_lr: float = key("Learning rate at the end of decay.", example=3e-5, minimum=0, maximum=K.LR_MAX)
    weight_decay: float = key("Decoupled weight decay.", example=0.1, minimum=0, maximum=K.WEIGHT_DECAY_MAX)
    beta1: float = key("Adam beta1.", example=0.9, minimum=0, maximum=1)
    beta2: float = key("Adam beta2.", example=0.95, minimum=0, maximum=1)
    eps: float = key("Adam epsilon.", example=1e-8, exclusive_minimum=0, maximum=K.EPS_MAX)


@dataclass(frozen=True, kw_only=True)
class LrScheduleSpec:
    """Learning-rate schedule: linear warm-up, then decay to min_lr at train.steps."""

    decay: Literal["cosine", "linear", "constant"] = key("Decay after warm-up.", example="cosine")
    warmup_steps: int = key("Linear warm-up steps.", example=100, minimum=0, maximum=K.STEPS_MAX)


@dataclass(frozen=True, kw_only=True)
class CheckpointSpec:
    """Where and how often training state is saved."""

    dir: str = key(
        "Checkpoint directory (relative to the working directory at run time).",
        example="runs/llama3_8b/checkpoints",
        kind=K.PATH,
    )
    interval: int = key("Save every this many steps.", example=1000, minimum=1, maximum=K.STEPS_MAX)
    keep_last_k: int = key(
        "Complete checkpoints kept; older ones are deleted after a new one is complete.",
        example=3,
        minimum=1,
        maximum=K.KEEP_MAX,
    )
    resume: Literal["auto", "never"] = key(
        "auto = load the newest complete checkpoint when one exists.", example="auto"
    )


@dataclass(frozen=True, kw_only=True)
class DataSourceSpec:
    """One dataset of a weighted blend, as a pair of Megatron's --data-path (WEIGHT PREFIX)."""

    path: str = key(
        "Megatron indexed-dataset prefix: PREFIX.bin and PREFIX.idx exist (written by `lmspec data prepare`).",
        example="data/web_text_document",
        kind=K.PATH,
    )
    weight: float = key(
        "Sampling weight; the blend's weights are normalised to sum to 1.",
        example=0.7,
        exclusive_minimum=0,
        maximum=K.BLEND_WEIGHT_MAX,
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
        kind=K.PATH,
    )
    sources: list[DataSourceSpec] | None = key(
        "Weighted blend of Megatron datasets (Megatron's --data-path); null = the corpus shipped with lmspec.",
        example=[{"path": "data/web_text_document", "weight": 1.0}],
        max_items=K.SOURCES_MAX,
    )
    split: str = key(
        "Documents divided train,valid,test in these proportions (Megatron's --split).",
        example="949,50,1",
        kind=K.SPLIT,
    )


@dataclass(frozen=True, kw_only=True)
class TrainSpec:
    """Training job."""

    backend: Literal["megatron", "deepspeed"] = key("Training framework.", example="megatron")
    transformer_impl: Literal["local", "transformer_engine"] = key(
        "Layer implementation (Megatron-LM's --transformer-impl): transformer_engine = TE's fused layers "
        "(GPU); local = pure PyTorch (megatron-core's local spec, or transformers' modeling code for deepspeed).",
        example="transformer_engine",
    )
    precision: Literal["bf16", "fp16", "fp32", "fp8"] = key(
        "Compute precision (bf16/fp16 keep fp32 master weights; fp8 = bf16 with FP8 GEMMs through "
        "Transformer Engine, scaled as train.fp8_recipe says).",
        example="bf16",
    )
    fp8_recipe: Literal["delayed", "blockwise"] | None = key(
        "FP8 scaling with train.precision=fp8: delayed = per-tensor delayed scaling (amax history); "
        "blockwise = 1x128 activation / 128x128 weight blocks (DeepSeek-V3). null otherwise.",
        example="blockwise",
    )
    seq_length: int = key("Tokens per training sequence.", example=4096, minimum=1, maximum=K.TOKENS_MAX)
    micro_batch_size: int = key("Sequences per GPU per forward/backward.", example=1, minimum=1, maximum=K.BATCH_MAX)
    global_batch_size: int = key(
        "Sequences per optimizer step across all data-parallel ranks.", example=1024, minimum=1, maximum=K.BATCH_MAX
    )
    recompute: Literal["none", "selective", "full"] = key("Activation recomputation.", example="selective")
    flash_attention: bool = key("Fused/flash attention kernel (does not store the s x s score matrix).", example=True)
    optimizer: OptimizerSpec = key("Optimizer.")
    lr_schedule: LrScheduleSpec = key("Learning-rate schedule.")
    grad_clip: float = key("Global gradient-norm clip; 0 = off.", example=1.0, minimum=0, maximum=K.GRAD_CLIP_MAX)
    steps: int = key("Optimizer steps to train.", example=1000, minimum=1, maximum=K.STEPS_MAX)
    seed: int = key("Random seed (model init, data order).", example=1234, minimum=0, maximum=K.SEED_MAX)
    log_interval: int = key("Log one metrics line every this many steps.", example=10, minimum=1, maximum=K.STEPS_MAX)
    eval_interval: int = key(
        "Validation loss every this many steps (and after the last).", example=1000, minimum=1, maximum=K.STEPS_MAX
    )
    eval_iters: int = key(
        "Global batches of the valid split per validation; 0 = no validation.",
        example=10,
        minimum=0,
        maximum=K.STEPS_MAX,
    )
    mtp_loss_weight: float = key(
        "Weight of the multi-token-prediction loss added to the LM loss (Megatron's "
        "--mtp-loss-scaling-factor; DeepSeek-V3: 0.3, then 0.1); used when model.mtp_layers > 0.",
        example=0.1,
        minimum=0,
        maximum=K.LOSS_WEIGHT_MAX,
    )
    init_from: str | None = key(
        "A checkpoint step directory written by lmspec (megatron: its torch_dist/) whose model weights "
        "training starts from, at any layout; optimizer, step and data start fresh. A checkpoint to resume "
        "in train.checkpoint.dir takes precedence. null = initialise from train.seed.",
        example="runs/base/checkpoints/step_1000",
        kind=K.PATH,
    )
    checkpoint: CheckpointSpec = key("Checkpointing.")
    data: DataSpec = key("Training data.")


@dataclass(frozen=True, kw_only=True)
class ServeSpec:
    """Serving a HuggingFace model directory with vLLM: the converted one, or serve.model_path."""

    engine: Literal["vllm"] = key("Serving engine.", example="vllm")
    tp: int = key("vLLM --tensor-parallel-size.", example=8, minimum=1, maximum=K.RANKS_MAX)
    pp: int = key("vLLM --pipeline-parallel-size.", example=1, minimum=1, maximum=K.RANKS_MAX)
    dp: int = key("vLLM --data-parallel-size.", example=1, minimum=1, maximum=K.RANKS_MAX)
    expert_parallel: bool = key("vLLM --enable-expert-parallel (MoE only).", example=False)
    max_model_len: int = key(
        "Longest request (prompt + output) in tokens; sizes the KV cache.",
        example=8192,
        minimum=1,
        maximum=K.TOKENS_MAX,
    )
    gpu_memory_utilization: float = key(
        "Fraction of device memory vLLM may use, in (0, 1].", example=0.9, exclusive_minimum=0, maximum=1
    )
    enforce_eager: bool = key("Disable CUDA graphs (debugging, CPU).", example=False)
    served_model_name: str = key("Model name clients send in requests.", example="llama3-8b", kind=K.LABEL)
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = key("Weight and activation dtype.", example="bfloat16")
    quantization: Literal["awq", "gptq", "fp8", "bitsandbytes"] | None = key(
        "Quantization method; null = none. AWQ/GPTQ need a calibrated checkpoint.", example="fp8"
    )
    kv_cache_dtype: Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2"] = key(
        "KV cache dtype; auto = model dtype.", example="auto"
    )
    max_num_seqs: int = key("Most sequences batched at once.", example=256, minimum=1, maximum=K.SEQS_MAX)
    max_num_batched_tokens: int | None = key(
        "Token budget per scheduler step; null = vLLM's default.",
        example=8192,
        minimum=1,
        maximum=K.BATCHED_TOKENS_MAX,
    )
    host: str = key(
        "Address the API server binds (node 0's in a multi-node engine, which must not be loopback).",
        example="127.0.0.1",
        kind=K.HOST,
    )
    port: int = key("Port of the OpenAI-compatible API.", example=8000, minimum=1, maximum=K.PORT_MAX)
    multi_node: Auto | Literal["ray", "data_parallel"] = key(
        "How an engine larger than one node spans nodes: ray = one Ray cluster, tensor/pipeline parallel "
        "across nodes (--distributed-executor-backend ray); data_parallel = vLLM's data parallel with one "
        "headless engine per further node (each data-parallel rank inside a node); auto = data_parallel "
        "where serve.tp x serve.pp fits in a node, else ray. Unused by a one-node engine.",
        example="auto",
    )
    ray_port: int = key(
        "Port of the Ray head on node 0 (serve.multi_node=ray).", example=6379, minimum=1, maximum=K.PORT_MAX
    )
    data_parallel_rpc_port: int = key(
        "vLLM --data-parallel-rpc-port on node 0 (serve.multi_node=data_parallel).",
        example=13345,
        minimum=1,
        maximum=K.PORT_MAX,
    )
    api_key_env: str | None = key(
        "Name of the environment variable holding the API key (never the key itself); null = no auth.",
        example="VLLM_API_KEY",
        kind=K.ENV_NAME,
    )
    model_path: str | None = key(
        "HuggingFace model directory to serve (a released or converted one); null = the conversion output "
        "(convert.output). Required when train is null.",
        example="runs/llama3_8b/hf",
        kind=K.PATH,
    )
    cpu_kvcache_space_gib: float = key(
        "VLLM_CPU_KVCACHE_SPACE for the CPU backend, GiB.", example=1, exclusive_minimum=0, maximum=K.MEMORY_GIB_MAX
    )


@dataclass(frozen=True, kw_only=True)
class ContainerSpec:
    """A container image for the launch step (pyxis' srun flags): the build and submit directories are
    mounted at their own paths, so the scripts and runs/ are where the batch script sees them."""

    image: str | None = key(
        "--container-image: a registry reference or a squashfs file; null = no container.",
        example="nvcr.io#nvidia/pytorch:25.01-py3",
        kind=K.CONTAINER_IMAGE,
    )
    mounts: list[str] = key(
        "--container-mounts beyond the build and submit directories, each SRC[:DST[:FLAGS]].",
        example=["/lustre/data:/data:ro"],
        kind=K.CONTAINER_MOUNT,
        max_items=K.SITE_LINES_MAX,
    )
    workdir: str | None = key(
        "--container-workdir; null = the directory sbatch was called from (where runs/ goes).",
        example="/workspace",
        kind=K.PATH,
    )


@dataclass(frozen=True, kw_only=True)
class SlurmSpec:
    """Slurm submission settings."""

    partition: str | None = key("--partition; null = the cluster default.", example="gpu", kind=K.SLURM_NAME)
    account: str | None = key("--account; null = none.", example="my_team", kind=K.SLURM_NAME)
    time: str = key("--time limit, [D-]HH:MM:SS.", example="24:00:00", kind=K.SLURM_TIME)
    cpus_per_task: int = key(
        "--cpus-per-task (one task per node runs torchrun).", example=64, minimum=1, maximum=K.CPUS_MAX
    )
    signal_seconds: int = key(
        "--signal=USR1@N: seconds before the time limit to checkpoint and requeue.",
        example=300,
        minimum=1,
        maximum=K.SIGNAL_SECONDS_MAX,
    )
    requeue: bool = key("--requeue: requeue after preemption or the pre-timeout checkpoint.", example=True)
    qos: str | None = key("--qos; null = the account's default.", example="high", kind=K.SLURM_NAME)
    reservation: str | None = key("--reservation; null = none.", example="maint_week", kind=K.SLURM_NAME)
    constraint: str | None = key(
        "--constraint: node features the job needs (Slurm's & | [] syntax); null = none.",
        example="h100&ib",
        kind=K.SLURM_VALUE,
    )
    exclusive: bool = key("--exclusive: no other job shares the nodes.", example=True)
    mem: int | str | None = key(
        "--mem per node: megabytes, or a size with K, M, G or T (0 = all of the node's); null = the partition default.",
        example="500G",
        minimum=0,
        maximum=K.SLURM_MEM_MB_MAX,
        kind=K.SLURM_MEM,
    )
    gres: str | None = key(
        "--gres, for sites that count GPUs as generic resources; replaces --gpus-per-node when set.",
        example="gpu:8",
        kind=K.SLURM_VALUE,
    )
    exclude: str | None = key(
        "--exclude: nodes not to use (a Slurm host list).", example="gpu[07,12]", kind=K.SLURM_VALUE
    )
    dependency: str | None = key(
        "--dependency: start after other jobs (afterok:ID, singleton, ...); null = none.",
        example="afterok:1234",
        kind=K.SLURM_VALUE,
    )
    extra_options: list[str] = key(
        "More #SBATCH options, each as written after #SBATCH (both training's and serving's sbatch.sh).",
        example=["--mail-type=END", "--comment=lmspec"],
        kind=K.SBATCH_OPTION,
        max_items=K.SITE_LINES_MAX,
    )
    srun_args: list[str] = key(
        "More srun arguments for the step that starts the launcher on every node, one word each.",
        example=["--cpu-bind=none", "--mpi=pmix"],
        kind=K.SRUN_ARG,
        max_items=K.SITE_LINES_MAX,
    )
    container: ContainerSpec = key("A container every node's launcher runs in (pyxis/enroot); image null = none.")


@dataclass(frozen=True, kw_only=True)
class NcclSpec:
    """NCCL settings written to nccl.env."""

    debug: Literal["VERSION", "WARN", "INFO", "TRACE"] = key("NCCL_DEBUG.", example="WARN")
    timeout_minutes: int = key(
        "Collective watchdog timeout; must outlast the longest checkpoint save.",
        example=30,
        minimum=1,
        maximum=K.TIMEOUT_MINUTES_MAX,
    )
    ib_timeout: int = key("NCCL_IB_TIMEOUT exponent (4.096 us x 2^n).", example=22, minimum=1, maximum=31)
    ib_retry_cnt: int = key("NCCL_IB_RETRY_CNT.", example=7, minimum=0, maximum=7)
    ib_gid_index: int | None = key(
        "NCCL_IB_GID_INDEX for RoCE (3 = RoCEv2 on most NICs); null = NCCL default.",
        example=3,
        minimum=0,
        maximum=K.GID_INDEX_MAX,
    )


@dataclass(frozen=True, kw_only=True)
class ClusterSpec:
    """How the job is launched."""

    launcher: Literal["local", "slurm"] = key("local = torchrun on this machine; slurm = sbatch.", example="local")
    master_port: int | None = key(
        "Rendezvous port on node 0, the same for every node; null = one per job: a free port on a one-node run, "
        "10000 + SLURM_JOB_ID % 20000 under Slurm, MASTER_PORT set on every node of a multi-node local run "
        "(lmspec run prints it).",
        example=29500,
        minimum=1,
        maximum=K.PORT_MAX,
    )
    env: list[str] = key(
        "Environment variables every node sets before the launcher (training and serving), NAME=value.",
        example=["HF_HOME=/lustre/hf", "TORCH_NCCL_ASYNC_ERROR_HANDLING=1"],
        kind=K.ENV_ASSIGNMENT,
        max_items=K.SITE_LINES_MAX,
    )
    setup: list[str] = key(
        "Shell lines every node runs before the launcher, as written (module load, a venv's activate), "
        "after cluster.env; under a container they run inside it.",
        example=["module load cuda/12.4", "source /opt/venv/bin/activate"],
        kind=K.SHELL_LINE,
        max_items=K.SITE_LINES_MAX,
    )
    slurm: SlurmSpec = key("Slurm settings (used when launcher is slurm).")
    storage_write_gb_per_s: float = key(
        "Aggregate write bandwidth, GB/s, of the filesystem train.checkpoint.dir is on, all nodes writing "
        "at once: it prices a checkpoint save (REPORT.md) against cluster.nccl.timeout_minutes. The default "
        "10 is a modest shared filesystem (one NVMe drive writes 2-7 GB/s; Lustre, GPFS, Weka or 3FS "
        "installations for thousands of GPUs reach hundreds of GB/s and more): set what yours sustains.",
        example=10,
        minimum=K.RATE_MIN,
        maximum=K.RATE_MAX,
    )
    nccl: NcclSpec = key("NCCL settings.")


@dataclass(frozen=True, kw_only=True)
class ConvertSpec:
    """Checkpoint conversion for serving."""

    target: Literal["hf"] = key("Target format.", example="hf")
    dtype: Literal["bfloat16", "float16", "float32"] = key("Dtype of the converted weights.", example="bfloat16")
    output: str = key("Output directory of the converted model.", example="runs/llama3_8b/hf", kind=K.PATH)


@dataclass(frozen=True, kw_only=True)
class Spec:
    """A whole lmspec job: model, hardware, layout, training, launch, conversion and serving.

    Three kinds of job: train and serve; train only (serve: null); serve only (train: null, which
    leaves parallel and convert unread and serves serve.model_path)."""

    name: str = key(
        "Job name: the build directory build/<name>/ and the Slurm job name.",
        example="llama3_8b",
        kind=K.PLAIN_NAME,
    )
    model: ModelSpec = key("Model architecture.")
    hardware: HardwareSpec = key("Hardware.")
    parallel: ParallelSpec | None = key("Training's parallel layout; null (or unread) in a serve-only job.")
    train: TrainSpec | None = key("Training; null = a serve-only job (serve.model_path is served).")
    cluster: ClusterSpec = key("Launch.")
    convert: ConvertSpec | None = key("Conversion of training checkpoints; null = none (serve-only jobs).")
    serve: ServeSpec | None = key("Serving; null = a train-only job.")


@dataclass(frozen=True, kw_only=True)
class TrainingSpec(Spec):
    """A spec that trains (train and parallel set): the type training's models, rules, emitters and
    runtime read, so none of them tests for a missing section."""

    parallel: ParallelSpec
    train: TrainSpec


@dataclass(frozen=True, kw_only=True)
class ServingSpec(Spec):
    """A spec that serves (serve set): the type serving's models, rules, emitters and runtime read."""

    serve: ServeSpec


def _narrowed(cls: type[_S], spec: Spec) -> _S:
    return cls(**{f.name: getattr(spec, f.name) for f in dataclasses.fields(Spec)})


def training(spec: Spec) -> TrainingSpec | None:
    """The spec as a TrainingSpec, or None for a serve-only job (train: null) or one without a layout."""
    if isinstance(spec, TrainingSpec):
        return spec
    if spec.train is None or spec.parallel is None:
        return None
    return _narrowed(TrainingSpec, spec)


def serving(spec: Spec) -> ServingSpec | None:
    """The spec as a ServingSpec, or None for a train-only job (serve: null)."""
    if isinstance(spec, ServingSpec):
        return spec
    return None if spec.serve is None else _narrowed(ServingSpec, spec)
