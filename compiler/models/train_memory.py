"""Training memory per GPU, by term and pipeline stage, as the backends really shard it.

Model state per parameter a GPU holds (mixed precision keeps fp32 master weights):

- Megatron: bf16/fp16 weights 2 B, fp32 main gradients 4 B, fp32 master + Adam m, v
  12 B: 18 B/param; the distributed optimizer shards the 12 B over the data-parallel
  group (dp x cp for dense parameters, expert-dp for experts): 6 + 12/d.
  fp32: 4 + 4 + 8 (no master copy).
- DeepSpeed, as its own estimators count it (`estimate_zero2/3_model_states_mem_needs`):
  16-bit weights 2 B and gradients 2 B, fp32 gradient partition 4 B, master + Adam 12 B;
  ZeRO-1 shards the fp32 gradient and optimizer partitions, ZeRO-2 also the 16-bit
  gradients (2 + 18/d), ZeRO-3 also the weights (18/d: its 16-bit gradients go straight into
  the fp32 partition) plus the largest module gathered (16-bit weights and gradients,
  4 B/param). Offload moves the fp32 partitions to host.

train.precision=fp8 or fp4 (Transformer Engine) adds the recipe's quantized weight copies
(compiler/models/recipes.py `Recipe.weight_bytes`): TE casts each bf16 weight once per step and keeps the
cast across micro-batches (its weight workspace, transformer_engine/pytorch/module/linear.py), rowwise for
the forward GEMM and columnwise for the backward's data-gradient GEMM, with the recipe's scales:

- delayed, tensorwise: 1 + 1 B on Hopper, Ada and AMD (their FP8 GEMMs are TN only, so TE keeps the
  transpose of the Float8Tensor), 1 B on Blackwell (non-TN FP8 GEMMs read one copy both ways); one fp32
  scale per tensor, not priced;
- blockwise: 2 x (1 + 4 / (128 x 128)) B: each direction quantized apart, one fp32 per 128 x 128 block;
- mxfp8: 2 x (1 + 1/32) B: each direction with one e8m0 scale per 32 elements;
- nvfp4: 2 x (1/2 + 1/16) B: e2m1 elements, one e4m3 scale per 16 (the per-tensor fp32 not priced).

Master copies are those of bf16: 2 B weights, fp32 main gradients, fp32 master weights with the optimizer.
The copies are priced on every parameter, an upper bound: embeddings, the output head, norms and routers
stay bf16. Activations are bf16 but for the GEMM inputs TE saves quantized for the weight gradient
(activations.py `quantized_input_bytes`: one layout, `Recipe.saved_input_bytes`).

TP divides the linear layers (norms and routers are replicated), PP splits the layers,
EP (x ETP) divides the routed experts; their distributed-optimizer state shards over expert-dp =
world / (pp x ep x etp). A MoE layer's routed activations are priced at the worst EP rank's load
(`moe_loads`: moe_load.rank_imbalance, capped by train.moe.capacity_factor, or exactly the capacity
with pad_to_capacity), and its dispatch buffers (train.moe.dispatcher) join the working term.
Activations follow `activations.py`, times the
micro-batches in flight under 1F1B: stage i holds min(pp - i, grad-accum) of them; interleaved
1F1B holds model chunks (`in_flight_micro_batches`), which on the first stage is Korthikanti's
pp x (1 + (pp - 1) / (pp x virtual stages)) (4.2.3).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from lmspec.compiler.backends import backend_of
from lmspec.compiler.models import ArrayOrNumber, larger, pick, smaller
from lmspec.compiler.models.activations import (
    ActivationSetting,
    dispatched_tokens,
    embedding_activation_bytes,
    head_activation_bytes,
    layer_activation_bytes,
    layer_shape,
    working_layer_bytes,
)
from lmspec.compiler.models.dims import ParallelDims
from lmspec.compiler.models.moe_dispatch import moe_a2a_overlaps
from lmspec.compiler.models.moe_load import Routing, rank_imbalance
from lmspec.compiler.models.params import count_params, is_moe_layer, layer_params
from lmspec.compiler.models.recipes import recipe_of
from lmspec.compiler.models.stages import stage_params
from lmspec.compiler.models.units import FP32_BYTES, GIB, precision_bytes
from lmspec.compiler.spec.sections import ModelSpec, TrainingSpec

# Device memory PyTorch cannot allocate: CUDA context, cuBLAS/NCCL workspaces, driver reserve.
DEVICE_RESERVE_GIB = 1.0
# Caching-allocator fragmentation and communication buckets, as a share of what is allocated.
FRAGMENTATION_FRACTION = 0.05
ADAM_STATES = 2  # exp_avg, exp_avg_sq
SGD_STATES = 1  # momentum buffer
TERMS = ("weights", "gradients", "optimizer", "activations", "buffers")


@dataclass(frozen=True, kw_only=True)
class StateBytes:
    """Bytes per parameter held on a GPU, by term (per candidate, as arrays, in compiler/search)."""

    weights: ArrayOrNumber
    gradients: ArrayOrNumber
    optimizer: ArrayOrNumber
    host: ArrayOrNumber = 0.0  # offloaded to host memory


@dataclass(frozen=True, kw_only=True)
class StageMemory:
    """One GPU of one pipeline stage."""

    stage: int
    layers: int
    dense_params: int  # non-expert parameters on this GPU before ZeRO/optimizer sharding
    expert_params: int  # routed-expert parameters on this GPU
    in_flight: float  # micro-batches whose activations are alive at the peak
    weights_bytes: int
    gradients_bytes: int
    optimizer_bytes: int
    activations_bytes: int
    buffers_bytes: int
    host_bytes: int

    @property
    def total_bytes(self) -> int:
        return (
            self.weights_bytes
            + self.gradients_bytes
            + self.optimizer_bytes
            + self.activations_bytes
            + self.buffers_bytes
        )

    def terms(self) -> dict[str, int]:
        return {t: getattr(self, f"{t}_bytes") for t in TERMS}


@dataclass(frozen=True, kw_only=True)
class TrainMemory:
    stages: tuple[StageMemory, ...]
    budget_bytes: int  # usable device memory: label minus DEVICE_RESERVE_GIB

    @property
    def worst(self) -> StageMemory:
        return max(self.stages, key=lambda s: (s.total_bytes, -s.stage))

    @property
    def fits(self) -> bool:
        return self.worst.total_bytes <= self.budget_bytes


def optimizer_states(spec: TrainingSpec) -> int:
    return ADAM_STATES if spec.train.optimizer.name in ("adam", "adamw") else SGD_STATES


def zero_state_bytes(
    stage: int,
    shards: ArrayOrNumber,
    *,
    param_bytes: float,
    grad_bytes: float,
    fp32_grad_bytes: float,
    optimizer_bytes: float,
    offload_optimizer: bool = False,
    offload_params: bool = False,
) -> StateBytes:
    """ZeRO stage 0-3 over `shards` ranks: P_os (1), +g (2), +p (3) as Rajbhandari et al. 2020."""
    os_div, g_div, p_div = (shards if stage >= 1 else 1), (shards if stage >= 2 else 1), (shards if stage >= 3 else 1)
    host = 0.0
    weights = param_bytes / p_div
    # ZeRO-3 reduce-scatters 16-bit gradients straight into the fp32 accumulation partition (the
    # 16-bit copy lives only in the gathered module's buffer); without an fp32 partition they stay.
    low_grads = 0.0 if stage >= 3 and fp32_grad_bytes else grad_bytes / g_div
    gradients = low_grads + fp32_grad_bytes / os_div
    optimizer = optimizer_bytes / os_div
    if offload_optimizer:
        host += optimizer + fp32_grad_bytes / os_div
        gradients -= fp32_grad_bytes / os_div
        gradients -= low_grads if stage >= 2 else 0  # reduced straight into host partitions
        optimizer = 0.0
    if offload_params:
        host += weights
        weights = 0.0
    return StateBytes(weights=weights, gradients=gradients, optimizer=optimizer, host=host)


def state_bytes(spec: TrainingSpec, shards: ArrayOrNumber) -> StateBytes:
    """Bytes per parameter on one GPU for this backend, precision and sharding degree."""
    t, p = spec.train, spec.parallel
    mixed = t.precision != "fp32"
    low = precision_bytes(t.precision)
    moments = optimizer_states(spec) * FP32_BYTES
    master = FP32_BYTES if mixed else 0
    if not backend_of(spec).zero_sharding:  # Megatron: the distributed optimizer shards fp32 state only
        shard = shards if p.distributed_optimizer else 1
        recipe = recipe_of(spec)
        copies = recipe.weight_bytes(spec.hardware.gpu.generation) if recipe is not None else 0
        return StateBytes(weights=low + copies, gradients=FP32_BYTES, optimizer=(master + moments) / shard)
    return zero_state_bytes(
        p.zero_stage,
        shards,
        param_bytes=low,
        grad_bytes=low,
        fp32_grad_bytes=FP32_BYTES if mixed else 0,
        optimizer_bytes=master + moments,
        offload_optimizer=p.offload_optimizer,
        offload_params=p.offload_params,
    )


def capacity_load(tokens: Any, top_k: int, experts: int, capacity_factor: float) -> Any:
    """Copies per expert over the mean when every expert is padded to its capacity, ceil(tokens x top_k x
    factor / experts) (megatron-core's get_capacity, on each rank's dispatched tokens)."""
    import math

    import numpy as np

    ceil = math.ceil if isinstance(tokens, int | float) else np.ceil
    return experts * ceil(tokens * top_k * capacity_factor / experts) / (tokens * top_k)


def moe_loads(spec: TrainingSpec, ep: Any, tokens: Any, sp_shards: Any = 1) -> tuple[Any, Any]:
    """(routed, sent) load of one GPU's MoE layers: routed copies its experts receive and copies it sends,
    over top_k per token. Received: the worst EP rank's share (moe_load.rank_imbalance: sampling spread,
    train.moe.load_imbalance or force_balance, capped at train.moe.capacity_factor); with
    pad_to_capacity every expert holds exactly its capacity, from every rank, so both are the capacity's.
    `tokens`: one micro-batch's tokens per context-parallel rank (moe_load's count, the step-time model's
    too); each GPU's dispatcher sees tokens / sp_shards of them (tp under sequence parallelism), whose
    capacity megatron pads to."""
    m, settings = spec.model.moe, spec.train.moe
    if m is None:
        return 1.0, 1.0
    if settings.capacity_factor is not None and settings.pad_to_capacity:
        padded = capacity_load(tokens / sp_shards, m.top_k, m.num_experts, settings.capacity_factor)
        return padded, padded
    routed = rank_imbalance(ep, tokens, m.top_k, replace(Routing.of(spec), pad_to_capacity=False))
    return routed, 1.0


def activation_setting(spec: TrainingSpec) -> ActivationSetting:
    """What decides one layout's activation bytes; `moe_loads` at its own ep (compiler/search re-prices
    them per candidate)."""
    t, p = spec.train, spec.parallel
    recipe = recipe_of(spec)
    act = ActivationSetting(
        style="hf" if backend_of(spec).hf_model_code else "megatron",
        seq_length=t.seq_length,
        micro_batch_size=t.micro_batch_size,
        element_bytes=precision_bytes(t.precision),
        tp=p.tp,
        cp=p.cp,
        etp=p.etp,
        sequence_parallel=p.sequence_parallel,
        recompute=t.recompute,
        flash_attention=t.flash_attention,
        kernels="fused" if t.transformer_impl == "transformer_engine" else "torch",
        ep=p.ep,
        dispatcher=t.moe.dispatcher,
        quantized_input_bytes=recipe.saved_input_bytes() if recipe is not None else None,
    )
    tokens = t.micro_batch_size * t.seq_length / p.cp
    routed, sent = moe_loads(spec, p.ep, tokens, tokens / dispatched_tokens(act))
    return replace(act, routed_load=routed, sent_load=sent)


def gathered_layer_bytes(spec: TrainingSpec) -> int:
    """ZeRO-3 gathers one module's 16-bit weights and gradients at a time; 0 otherwise."""
    t, p = spec.train, spec.parallel
    if backend_of(spec).zero_sharding and p.zero_stage == 3:
        return 2 * precision_bytes(t.precision) * count_params(spec.model).largest_layer
    return 0


def stage_terms(
    dense: Any,
    expert: Any,
    per_mb: Any,
    working: Any,
    in_flight: Any,
    dense_state: StateBytes,
    expert_state: StateBytes,
    gather_bytes: Any,
) -> tuple[Any, Any, Any, Any, Any]:
    """(weights, gradients, optimizer, activations, buffers) bytes of one stage's GPU. Plain
    arithmetic: `lmspec plan` calls it on numpy arrays of candidates (compiler/search)."""
    weights = dense * dense_state.weights + expert * expert_state.weights
    grads = dense * dense_state.gradients + expert * expert_state.gradients
    optim = dense * dense_state.optimizer + expert * expert_state.optimizer
    activations = per_mb * in_flight + working
    buffers = gather_bytes + FRAGMENTATION_FRACTION * (weights + grads + optim + activations)
    return weights, grads, optim, activations, buffers


def budget_bytes(memory_gib: float) -> int:
    """Usable device memory: the label minus DEVICE_RESERVE_GIB (the Plan, the budget rule and `lmspec plan`)."""
    return round((memory_gib - DEVICE_RESERVE_GIB) * GIB)


def _layers_in_first_chunks(chunks: Any, layers: Any, v: Any) -> Any:
    """Layers in the first `chunks` forwards' chunks of a stage of `layers` split into v chunks as
    compiler/models/dims.py `chunk_layers` splits it (the first layers % v chunks one layer more), the
    chunk index cycling 0, 1, ..., v - 1."""
    rounds, part = chunks // v, chunks % v
    return rounds * layers + part * (layers // v) + smaller(part, layers % v)


def in_flight_micro_batches(
    pp: Any, stage: Any, micro_batches: Any, virtual_stages: Any, stage_layers: Any, a2a_overlap: Any = 0
) -> Any:
    """Micro-batches' activations alive at the peak of `stage` (of `stage_layers` layers), as megatron-core
    0.16.1's schedules run.

    1F1B (`virtual_stages` 1): the warm-up forwards pp - stage - 1, the steady state one more, at most all
    of them; without a pipeline the combined 1F1B of `a2a_overlap` (parallel.overlap.moe_a2a) runs one
    micro-batch's forward beside another's backward: two. Interleaved (`get_pp_rank_microbatches`, groups
    of pp micro-batches): the warm-up runs N = 2 (pp - stage - 1) + (v - 1) pp chunk forwards, one more
    with the overlap (schedules.py adds a warm-up forward to pair with the first backward), the steady state
    one more, at most all v x M. Forward k runs chunk (k // pp) mod v, and the chunks differ by a layer
    where the stage's layers do not split evenly, so the peak holds the layers of those N chunks over the
    stage's: N / v micro-batches on an even split. Plain arithmetic: `lmspec plan` prices its candidates
    with it."""
    v = virtual_stages
    plain = smaller(pp - stage + a2a_overlap * (pp == 1), micro_batches)
    forwards = smaller(2 * (pp - stage - 1) + (v - 1) * pp + 1 + a2a_overlap, v * micro_batches)
    groups, rest = forwards // pp, forwards % pp
    next_chunk = stage_layers // v + ((groups % v) < (stage_layers % v))
    layers = pp * _layers_in_first_chunks(groups, stage_layers, v) + rest * next_chunk
    interleaved = layers / larger(stage_layers, 1)
    return pick(v > 1, interleaved, plain)


def last_stage_activation_bytes(m: ModelSpec, act: ActivationSetting) -> Any:
    """The last stage's activations beyond its layers: the output head, and each MTP module's embedding
    lookup, one layer like the decoder's last and one more head and logits."""
    last_layer = layer_shape(m, is_moe_layer(m, m.num_layers - 1))
    mtp = layer_activation_bytes(last_layer, act) + embedding_activation_bytes(act) + head_activation_bytes(m, act)
    return head_activation_bytes(m, act) + m.mtp_layers * mtp  # not in place: on arrays the shapes broadcast


def estimate_train_memory(spec: TrainingSpec) -> TrainMemory | None:
    """Per-GPU memory of every pipeline stage; None when the layout itself is illegal."""
    dims = ParallelDims.from_spec(spec)
    if dims is None:
        return None
    m, p = spec.model, spec.parallel
    counts = count_params(m)
    layers = [layer_params(m, i) for i in range(m.num_layers)]
    dense_state, expert_state = state_bytes(spec, dims.dense_dp), state_bytes(spec, dims.expert_dp)
    act = activation_setting(spec)
    gather_bytes = gathered_layer_bytes(spec)
    a2a_overlap = moe_a2a_overlaps(p.overlap.moe_a2a, p.ep, spec.train.recompute == "full", p.pp, p.virtual_stages or 1)
    out: list[StageMemory] = []
    first = 0
    for index, n_layers in enumerate(dims.stage_layers):
        dense, expert = stage_params(layers, counts, first, first + n_layers, p.pp).per_gpu(p.tp, p.ep, p.etp)
        per_mb = 0.0
        working = 0.0
        for i in range(first, first + n_layers):
            shape = layer_shape(m, is_moe_layer(m, i))
            per_mb += layer_activation_bytes(shape, act)
            working = max(working, working_layer_bytes(shape, act))
        first += n_layers
        if index == 0:
            per_mb += embedding_activation_bytes(act)
        if index == len(dims.stage_layers) - 1:
            per_mb += last_stage_activation_bytes(m, act)
        in_flight = float(
            in_flight_micro_batches(p.pp, index, dims.micro_batches, p.virtual_stages or 1, n_layers, a2a_overlap)
        )
        weights, grads, optim, activations, buffers = stage_terms(
            dense, expert, per_mb, working, in_flight, dense_state, expert_state, gather_bytes
        )
        out.append(
            StageMemory(
                stage=index,
                layers=n_layers,
                dense_params=round(dense),
                expert_params=round(expert),
                in_flight=in_flight,
                weights_bytes=round(weights),
                gradients_bytes=round(grads),
                optimizer_bytes=round(optim),
                activations_bytes=round(activations),
                buffers_bytes=round(buffers),
                host_bytes=round(dense * dense_state.host + expert * expert_state.host),
            )
        )
    return TrainMemory(stages=tuple(out), budget_bytes=budget_bytes(spec.hardware.gpu.memory_gib))
