"""What the step-time model takes in: the job's constants (`StepConstants`) and each layout's inputs
(`StepInputs`), and how a spec becomes them.

The formulas (compiler/models/steptime.py, steptime_compute.py, steptime_comm.py) take plain numbers or
numpy arrays so `lmspec plan` prices a million layouts with the same code that prices one; this module is
the one place a typed spec is turned into those numbers for the spec's own layout (the search builds its
arrays of `StepInputs` itself, compiler/search/evaluate.py), and where the hardware's datasheet links
become the bandwidths NCCL reaches.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lmspec.compiler.backends import backend_of
from lmspec.compiler.models.comm import Links, dp_grad_bytes, worst_gpu_params
from lmspec.compiler.models.dims import ParallelDims
from lmspec.compiler.models.flops import mlp_flops_per_token, routed_expert_flops_per_token
from lmspec.compiler.models.moe_dispatch import moe_a2a_overlaps
from lmspec.compiler.models.moe_load import Routing
from lmspec.compiler.models.recipes import recipe_of
from lmspec.compiler.models.stages import slowest_stage_work
from lmspec.compiler.models.train_memory import TrainMemory
from lmspec.compiler.models.units import GB, GBIT, TFLOPS, precision_bytes
from lmspec.compiler.spec.sections import TrainingSpec

# Datasheet NVLink and xGMI figures add both directions; a ring sends one way at a time on each link.
LINK_DIRECTION_FRACTION = {"nvlink": 0.5, "nvlink5": 0.5, "xgmi": 0.5, "pcie": 1.0, "shm": 1.0}
# Links that join a node's GPUs as a full mesh of point-to-point links rather than through a switch: AMD's
# Infinity Fabric (an MI300X has 7 xGMI links, one to each other GPU of its platform, ~128 GB/s each).
MESH_LINKS = ("xgmi",)
# NCCL bus bandwidth over link bandwidth (nccl-tests: ~230 of 300 GB/s per direction on A100
# NVLink, ~40 of 50 GB/s per 400G NIC).
INTRA_NODE_BUS_EFFICIENCY = 0.8
INTER_NODE_BUS_EFFICIENCY = 0.8


def bus_links(hardware: Any) -> Links:
    """The bandwidths NCCL's rings reach, per GPU, inside a node and over its share of the node's NICs."""
    intra = (
        hardware.intra_node.gb_per_s
        * GB
        * LINK_DIRECTION_FRACTION[hardware.intra_node.link]
        * INTRA_NODE_BUS_EFFICIENCY
    )
    inter = (
        hardware.inter_node.nics_per_node
        * hardware.inter_node.gbit_per_s_per_nic
        * GBIT
        / hardware.gpus_per_node
        * INTER_NODE_BUS_EFFICIENCY
    )
    mesh = hardware.intra_node.link in MESH_LINKS
    return Links(intra, inter, mesh_peers=hardware.gpus_per_node - 1 if mesh else 0)


@dataclass(frozen=True, kw_only=True)
class StepConstants:
    """What the step-time model takes from the job rather than the layout (`step_constants`)."""

    hidden: int
    q_width: int  # query (and attention output) width of a layer: heads x head dim
    kv_width: int  # keys plus values per token of a layer as attention reads them (ring attention sends these)
    head_dim: int
    heads: int
    seq_length: int
    ffn: int  # dense MLP width
    expert_ffn: int
    top_k: int
    shared_experts: int
    num_experts: int
    vocab: int
    routed_expert_flops: float  # model FLOPs per token of one MoE layer's routed experts
    shared_expert_flops: float  # model FLOPs per token of one MoE layer's shared experts
    dispatcher: str  # train.moe.dispatcher: alltoall, allgather or flex (DeepEP/HybridEP)
    route_groups: int  # model.moe.router_num_groups (0: no group-limited routing)
    route_group_topk: int  # model.moe.router_group_topk: groups a token may route into
    shared_expert_overlap: bool  # train.moe.shared_expert_overlap: shared experts run beside the all-to-alls
    permute_fusion: bool  # train.moe.permute_fusion: TE's fused permutation kernels
    routing: Routing  # what decides the busiest EP rank's load (moe_load.py)
    quantized: bool  # the GEMMs run in FP8 or FP4 (train.precision's recipe, on a part with its tensor cores)
    operand_bytes: float  # per GEMM operand element: the recipe's (1 FP8, 0.5 FP4), else train.precision's
    cast_bytes: float  # HBM bytes per GEMM input element the recipe's quantization moves (recipes.Recipe)
    flash_attention: bool
    overlap_grad_reduce: bool
    overlap_param_gather: bool
    overlap_tp_comm: bool
    peak_flops: float  # sustained bf16 peak (core attention, the bf16 GEMMs)
    gemm_peak_flops: float  # sustained peak of the GEMMs: FP8's or FP4's under train.precision=fp8 or fp4
    hbm_bytes_per_s: float
    link: Links
    generation: str


@dataclass(frozen=True, kw_only=True)
class StepInputs:
    """Per candidate (scalars or arrays): the layout, and the work and state of its slowest stage."""

    dims: ParallelDims
    virtual_stages: Any  # model chunks per pipeline rank (1: plain 1F1B)
    tokens_per_micro_batch: Any  # micro_batch_size x seq_length (one DP rank, before cp)
    sequence_parallel: Any
    unfused_kernels: Any  # the backend runs transformers' modeling code (TrainingBackend.hf_model_code)
    reduces_after_backward: Any  # TrainingBackend.reduces_after_backward
    gathers_after_step: Any  # TrainingBackend.gathers_after_step
    reduces_every_micro_batch: Any  # FSDP2 as torchtitan runs it (TrainingBackend.fsdp)
    grad_bytes: Any  # per gradient element on the wire (comm.dp_grad_bytes)
    element_bytes: Any  # per weight or activation element under train.precision
    zero_stage: Any
    distributed_optimizer: Any
    full_recompute: Any
    recompute_attention: Any  # 1 where selective or full recompute repeats the core attention
    moe_a2a: Any  # 1 where parallel.overlap.moe_a2a hides this layout's all-to-alls (`moe_a2a_overlaps`)
    stage_flops_per_token: Any  # hardware FLOPs of the slowest stage's layers (+ head), per token
    attention_flops_per_token: Any  # core attention (model FLOPs) of the most loaded stage
    stage_layers: Any  # layers on the slowest stage
    stage_moe_layers: Any  # of which MoE
    dense_params: Any  # non-expert parameters on one GPU of the largest stage
    expert_params: Any  # routed-expert parameters on that GPU


def step_constants(spec: TrainingSpec) -> StepConstants:
    """The step-time model's inputs that depend on the job, not on the layout."""
    hw, m, t, p = spec.hardware, spec.model, spec.train, spec.parallel
    recipe = recipe_of(spec)
    low_peak = {"fp8": hw.gpu.fp8_tflops, "fp4": hw.gpu.fp4_tflops}.get(t.precision)
    quantized = recipe is not None and low_peak is not None
    sustained = hw.gpu.sustained_fraction
    if m.attention == "mla":
        assert m.mla is not None
        head_dim = m.mla.qk_nope_head_dim + m.mla.qk_rope_head_dim
        kv_width = m.num_attention_heads * (head_dim + m.mla.v_head_dim)  # per head after the up-projection
    else:
        head_dim = m.head_dim
        kv_width = 2 * m.num_kv_heads * m.head_dim
    moe = m.moe
    return StepConstants(
        hidden=m.hidden_size,
        q_width=m.num_attention_heads * head_dim,
        kv_width=kv_width,
        head_dim=head_dim,
        heads=m.num_attention_heads,
        seq_length=t.seq_length,
        ffn=m.ffn_hidden_size,
        expert_ffn=moe.ffn_hidden_size if moe else 0,
        top_k=moe.top_k if moe else 0,
        shared_experts=moe.num_shared_experts if moe else 0,
        num_experts=moe.num_experts if moe else 0,
        vocab=m.vocab_size,
        routed_expert_flops=routed_expert_flops_per_token(m),
        shared_expert_flops=mlp_flops_per_token(m.hidden_size, moe.num_shared_experts * moe.ffn_hidden_size)
        if moe
        else 0.0,
        dispatcher=t.moe.dispatcher,
        route_groups=(moe.router_num_groups or 0) if moe else 0,
        route_group_topk=(moe.router_group_topk or 0) if moe else 0,
        shared_expert_overlap=t.moe.shared_expert_overlap,
        permute_fusion=t.moe.permute_fusion,
        routing=Routing.of(spec),
        quantized=quantized,
        operand_bytes=recipe.element_bytes if recipe is not None and quantized else precision_bytes(t.precision),
        cast_bytes=recipe.cast_bytes(hw.gpu.generation) if recipe is not None and quantized else 0.0,
        flash_attention=t.flash_attention,
        overlap_grad_reduce=p.overlap.grad_reduce,
        overlap_param_gather=p.overlap.param_gather,
        overlap_tp_comm=p.overlap.tp_comm,
        peak_flops=hw.gpu.bf16_tflops * sustained * TFLOPS,
        gemm_peak_flops=(low_peak if quantized and low_peak else hw.gpu.bf16_tflops) * sustained * TFLOPS,
        hbm_bytes_per_s=hw.gpu.hbm_gb_per_s * GB,
        link=bus_links(hw),
        generation=hw.gpu.generation,
    )


def step_inputs(spec: TrainingSpec, memory: TrainMemory) -> StepInputs | None:
    """The spec's own layout as the step-time model's inputs; the DP traffic and optimizer update are those
    of the GPU the memory model finds worst (`memory`). None when the layout does not divide."""
    dims = ParallelDims.from_spec(spec)
    if dims is None:
        return None
    m, p, t = spec.model, spec.parallel, spec.train
    backend = backend_of(spec)
    work = slowest_stage_work(m, t.seq_length, dims.stage_layers, t.recompute)
    dense, expert = worst_gpu_params(spec, dims, memory)
    return StepInputs(
        dims=dims,
        virtual_stages=p.virtual_stages or 1,
        tokens_per_micro_batch=t.micro_batch_size * t.seq_length,
        sequence_parallel=p.sequence_parallel,
        unfused_kernels=backend.hf_model_code,
        reduces_after_backward=backend.reduces_after_backward,
        gathers_after_step=backend.gathers_after_step,
        reduces_every_micro_batch=backend.fsdp,
        grad_bytes=dp_grad_bytes(backend.grad_reduce_in_fp32(t.precision), t.precision),
        element_bytes=precision_bytes(t.precision),
        zero_stage=p.zero_stage,
        distributed_optimizer=p.distributed_optimizer,
        full_recompute=t.recompute == "full",
        recompute_attention=t.recompute != "none",
        moe_a2a=moe_a2a_overlaps(p.overlap.moe_a2a, p.ep, t.recompute == "full", p.pp, p.virtual_stages or 1),
        stage_flops_per_token=work.hardware_flops,
        attention_flops_per_token=work.attention_flops,
        stage_layers=work.layers,
        stage_moe_layers=work.moe_layers,
        dense_params=dense,
        expert_params=expert,
    )
