"""Training memory per GPU at the peak of a step, by term and pipeline stage, as the backends allocate it.

`StageMemory.allocated_bytes` is the step's peak of allocated bytes (a GPU's max_memory_allocated), an
upper bound held to one step measured exactly on CPU through the runtime's own trainers, every rank of
every sharding kind (tests/models/test_measured_step_memory.py, bench/memory_measured.py); `total_bytes`
adds what the caching allocator reserves beyond it (`allocator`), the number the budget rule weighs.

Model state per parameter a GPU holds (mixed precision keeps fp32 master weights):

- Megatron: bf16/fp16 weights 2 B, fp32 main gradients 4 B, fp32 master + Adam m, v
  12 B: 18 B/param; the distributed optimizer shards the 12 B over the data-parallel
  group (dp x cp for dense parameters, expert-dp for experts): 6 + 12/d.
  fp32: 4 + 4 + 8 (no master copy).
- DeepSpeed as its engine and ZeRO optimizers allocate at the backward peak (`deepspeed_state_bytes`), not
  as its estimators count: gradients per micro-batch accumulation and ZeRO stage, an fp32 master
  partition even in fp32, ZeRO-3's gradient partition in the model's dtype; its buckets, partition edges
  and gathered parameters are the workspace (`deepspeed_workspace`).

The working term is what the peak holds beyond the micro-batches' saved activations
(`stage_working_bytes`): a MoE layer's dispatch buffers, full recompute's rebuilt layer, the head's and the
last layer's backward. The workspace also holds the buffers of the layout (`stage_held_bytes`): megatron's
persistent buffers, the pipeline schedule's inputs and gradients, the step's inputs on the CPU target.

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
from lmspec.compiler.backends.deepspeed_buffers import (
    ALLREDUCE_FLAT_ELEMENTS,
    ZERO3_MAX_LIVE_PARAMETERS,
    ZERO3_SUB_GROUP_ELEMENTS,
    bucket_elements,
)
from lmspec.compiler.models import ArrayOrNumber, larger, pick, smaller
from lmspec.compiler.models.activations import (
    ActivationSetting,
    backward_working_bytes,
    dispatched_tokens,
    embedding_activation_bytes,
    head_activation_bytes,
    head_working_bytes,
    layer_activation_bytes,
    layer_shape,
    persistent_buffer_bytes,
    pipeline_held_bytes,
    residual_bytes,
    step_input_bytes,
    working_layer_bytes,
)
from lmspec.compiler.models.dims import ParallelDims, device_kind
from lmspec.compiler.models.moe_dispatch import moe_a2a_overlaps
from lmspec.compiler.models.moe_load import Routing, rank_imbalance
from lmspec.compiler.models.params import count_params, is_moe_layer, layer_params
from lmspec.compiler.models.recipes import recipe_of
from lmspec.compiler.models.stages import stage_params
from lmspec.compiler.models.units import FP32_BYTES, GIB, precision_bytes
from lmspec.compiler.spec.sections import ModelSpec, TrainingSpec

# Device memory PyTorch cannot allocate: CUDA context, cuBLAS/NCCL workspaces, driver reserve.
DEVICE_RESERVE_GIB = 1.0
# What the caching allocator reserves beyond what is allocated (fragmentation, blocks cached for reuse), as a
# share of it: not yet modelled from the allocator, which needs max_memory_reserved from a GPU.
FRAGMENTATION_FRACTION = 0.05
ADAM_STATES = 2  # exp_avg, exp_avg_sq
FP64_BYTES = 8  # DeepSpeed's ZeRO-1/2 gradient norm casts a gradient to fp64
SGD_STATES = 1  # momentum buffer
# What the step allocates (`allocated_bytes`: a GPU's max_memory_allocated), then what the caching allocator
# holds beyond it (reserved).
ALLOCATED_TERMS = ("weights", "gradients", "optimizer", "activations", "workspace")
TERMS = (*ALLOCATED_TERMS, "allocator")


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
    workspace_bytes: int  # buffers the backend allocates beside the model state and the activations
    allocator_bytes: int  # reserved by the caching allocator beyond what is allocated
    host_bytes: int

    @property
    def allocated_bytes(self) -> int:
        """The step's peak of allocated bytes: what a GPU's torch.cuda.max_memory_allocated reports."""
        return sum(getattr(self, f"{t}_bytes") for t in ALLOCATED_TERMS)

    @property
    def total_bytes(self) -> int:
        """Reserved at the peak: what the device must hold."""
        return self.allocated_bytes + self.allocator_bytes

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


def deepspeed_state_bytes(spec: TrainingSpec, shards: ArrayOrNumber, micro_batches: ArrayOrNumber) -> StateBytes:
    """Bytes per parameter a DeepSpeed GPU holds at the backward peak of a step, as DeepSpeed 0.18's
    engine and ZeRO optimizers allocate them (measured on CPU, tests/models/test_measured_step_memory.py),
    not as its estimators (`estimate_zero2/3_model_states_mem_needs`) count them. e = the model's bytes,
    d = `shards`, accumulating = more than one micro-batch per step.

    - weights: e (ZeRO-3: its e/d partition; the gathered modules are workspace).
    - gradients: ZeRO-0 keeps `param.grad` from the first micro-batch's backward to the step (the engine sets
      it to None after each step, so one micro-batch's backward holds none), plus bf16/fp16 optimizers' fp32
      accumulation copy. ZeRO-1 accumulates whole `param.grad` likewise and, in the boundary backward,
      reduces into `grads_in_partition` (e/d; stage_1_and_2.py `copy_grads_in_partition`). ZeRO-2 makes a
      new `grads_in_partition` each micro-batch, and the last one is still referenced when the next is made;
      the first micro-batch's is referenced until the boundary by the accumulation list (`all_grad_tensors`:
      `get_all_grad_tensors` keeps the gradients themselves, lmspec sets no data_types.grad_accum_dtype):
      two in the second micro-batch's backward, three from the third on (measured at accumulation 4: three
      live in the backward of some runs, as the reductions' order falls). ZeRO-3 accumulates into its
      persistent partition (`grad_partitions_flat_buffer`, in the model's dtype: lmspec sets no
      data_types.grad_accum_dtype).
    - optimizer: Adam's moments and, under ZeRO 1-3, an fp32 master partition, always: DeepSpeed clones
      one even for fp32 training (stage_1_and_2.py `single_partition_of_fp32_groups`; stage3.py compares a
      torch.device with a device name to share it, which never holds). ZeRO-0 in fp32 steps the
      parameters themselves.
    Offload moves the fp32 partitions (master, moments, the reduced gradients) to host memory."""
    t, p = spec.train, spec.parallel
    stage, e = p.zero_stage, precision_bytes(t.precision)
    mixed = t.precision != "fp32"
    moments = optimizer_states(spec) * FP32_BYTES
    accumulating = micro_batches > 1
    optimizer: ArrayOrNumber
    if stage == 0:
        weights, optimizer = float(e), moments + (FP32_BYTES if mixed else 0)
        gradients = e * accumulating + (FP32_BYTES if mixed else 0)
    else:
        weights = e / shards if stage == 3 else float(e)
        optimizer = (FP32_BYTES + moments) / shards
        whole: ArrayOrNumber = e * accumulating if stage == 1 else 0
        partitions = 1 + accumulating + (micro_batches > 2) if stage == 2 else 1
        gradients = whole + partitions * e / shards
    host: ArrayOrNumber = 0.0
    if p.offload_optimizer and stage >= 1:  # the partitions' gradients are reduced into host buffers
        host, optimizer = optimizer + FP32_BYTES / shards, 0.0
        gradients = whole
    if p.offload_params and stage == 3:
        host, weights = host + weights, 0.0
    return StateBytes(weights=weights, gradients=gradients, optimizer=optimizer, host=host)


def fsdp2_state_bytes(
    spec: TrainingSpec, shards: ArrayOrNumber, micro_batches: ArrayOrNumber, pp: ArrayOrNumber = 1
) -> StateBytes:
    """Bytes per parameter an FSDP2 rank holds, as torchtitan shards (fully_shard on each decoder layer and
    the root; measured on CPU through the runtime's trainer, tests/models/test_measured_step_memory.py).
    d = `shards` from parallel.zero_stage 2 (1 when replicated: zero_stage 0).

    - weights: the DTensor shards in the parameters' own dtype, fp32 (MixedPrecisionPolicy casts the gathered
      copy for compute: workspace), 4/d.
    - gradients: the sharded gradients, reduce-scattered in fp32 (reduce_dtype) every micro-batch and
      accumulated in place (torchtitan keeps no unsharded gradients between micro-batches), 4/d from the
      second micro-batch's backward on. The first backward makes them a layer at a time as it frees that
      layer's activations, so its peak holds the larger of the two, not their sum: the step phase prices the
      end of the backward, every gradient made (`step_phase_bytes`).
    - optimizer: Adam's moments on the shards, 8/d; no master copy (the shards are the fp32 weights).
    - under a pipeline (pp > 1), torch's PipelineStage runs every micro-batch's backward but the last without
      gradient sync and without resharding (backward_maybe_with_nosync: set_requires_gradient_sync(False),
      set_reshard_after_backward(False)): from the first backward to the step the stage holds its weights
      gathered (c per parameter) and its gradients unsharded, accumulated in the fp32 reduce dtype (4), in place
      of the sharded ones. An upper bound at the tiny scale measured (the per-layer buffers are counted beside
      it), the whole stage's bytes at scale."""
    d = pick(spec.parallel.zero_stage > 0, shards, 1)
    moments = optimizer_states(spec) * FP32_BYTES
    pipelined = pp > 1
    gradients = pick(pipelined, FP32_BYTES, FP32_BYTES / d * (micro_batches > 1))
    gathered = precision_bytes(spec.train.precision) * pipelined
    return StateBytes(weights=FP32_BYTES / d + gathered, gradients=gradients, optimizer=moments / d)


def state_bytes(
    spec: TrainingSpec, shards: ArrayOrNumber, micro_batches: ArrayOrNumber, pp: ArrayOrNumber = 1
) -> StateBytes:
    """Bytes per parameter on one GPU for this backend, precision, sharding degree and pipeline depth."""
    t, p = spec.train, spec.parallel
    if backend_of(spec).fsdp:
        return fsdp2_state_bytes(spec, shards, micro_batches, pp)
    if backend_of(spec).zero_sharding:
        return deepspeed_state_bytes(spec, shards, micro_batches)
    # Megatron: the distributed optimizer shards the fp32 state only
    mixed = t.precision != "fp32"
    low = precision_bytes(t.precision)
    moments = optimizer_states(spec) * FP32_BYTES
    master = FP32_BYTES if mixed else 0
    shard = shards if p.distributed_optimizer else 1
    recipe = recipe_of(spec)
    copies = recipe.weight_bytes(spec.hardware.gpu.generation) if recipe is not None else 0
    return StateBytes(weights=low + copies, gradients=FP32_BYTES, optimizer=(master + moments) / shard)


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
        cpu=device_kind(spec) == "cpu",
    )
    tokens = t.micro_batch_size * t.seq_length / p.cp
    routed, sent = moe_loads(spec, p.ep, tokens, tokens / dispatched_tokens(act))
    return replace(act, routed_load=routed, sent_load=sent)


@dataclass(frozen=True, kw_only=True)
class Workspace:
    """Buffers a GPU's backend allocates beside the model state and the activations: `fixed` bytes, of which
    `split` tensor parallelism divides (their bytes at tp 1), and gathered parameters (ZeRO-3),
    `gathered_bytes` per parameter of the GPU's stage, of at most `gathered_cap` parameters; and `layer`
    bytes (TP dividing `layer_split` of them) that exist only while a decoder layer runs its backward, after
    the head's backward has freed its activations (FSDP2's per-layer buffers). Arrays of candidates in
    compiler/search."""

    fixed: ArrayOrNumber = 0.0
    split: ArrayOrNumber = 0.0
    gathered_bytes: ArrayOrNumber = 0.0
    gathered_cap: ArrayOrNumber = 0.0
    layer: ArrayOrNumber = 0.0
    layer_split: ArrayOrNumber = 0.0
    # of `layer`, the layer's own gathered weights and unsharded gradients, which a pipeline stage's state holds
    # already (fsdp2_state_bytes at pp > 1)
    layer_state: ArrayOrNumber = 0.0
    layer_state_split: ArrayOrNumber = 0.0

    def fixed_at(self, tp: ArrayOrNumber) -> ArrayOrNumber:
        return self.fixed + self.split / tp

    def layer_at(self, tp: ArrayOrNumber, pp: ArrayOrNumber = 1) -> ArrayOrNumber:
        """The per-layer bytes at this TP degree; in a pipeline (pp > 1) less what the stage's state holds."""
        return self.layer + self.layer_split / tp - (pp > 1) * (self.layer_state + self.layer_state_split / tp)

    def at(self, params: ArrayOrNumber, tp: ArrayOrNumber) -> ArrayOrNumber:
        return self.fixed_at(tp) + self.gathered_bytes * smaller(params, self.gathered_cap)


def deepspeed_workspace(spec: TrainingSpec) -> Workspace:
    """ZeRO's buffers at the backward peak (compiler/backends/deepspeed_buffers.py sizes them), in the model's
    dtype: ZeRO-1/2 the gradient-reduction bucket (twice under overlap_comm) and, per `grads_in_partition`
    (one, two under ZeRO-2), the parameter that straddles the partition's edge (its size counts the
    parameters that overlap the partition: at most the largest one more); ZeRO-3 its bucket, the gradients
    of the module whose backward runs before they are reduced, and the gathered parameters: all of them up
    to stage3_max_live_parameters (plus the module being gathered), since every parameter is used again
    within stage3_max_reuse_distance of its forward."""
    p, e = spec.parallel, precision_bytes(spec.train.precision)
    bucket = bucket_elements(spec.model.hidden_size) * e
    largest = count_params(spec.model).largest_layer
    if p.zero_stage in (1, 2):
        partitions = 2 if p.zero_stage == 2 else 1
        return Workspace(fixed=bucket * (1 + p.overlap.grad_reduce) + partitions * e * largest)
    if p.zero_stage == 3:
        gathered = 0.0 if p.offload_params else float(e)
        return Workspace(
            fixed=bucket + e * largest, gathered_bytes=gathered, gathered_cap=ZERO3_MAX_LIVE_PARAMETERS + largest
        )
    return Workspace()


@dataclass(frozen=True, kw_only=True)
class StepPhase:
    """What decides the peak after the backward, when the gradients are reduced and the optimizer steps (no
    activation alive): per spec, or arrays of candidates in compiler/search."""

    zero_stage: ArrayOrNumber  # DeepSpeed's ZeRO stage; -1 for megatron
    fsdp: ArrayOrNumber  # 1 where FSDP2 shards (TrainingBackend.fsdp): its own branch, whatever the stage
    element_bytes: ArrayOrNumber
    mixed: ArrayOrNumber  # 1 under bf16/fp16
    cpu: ArrayOrNumber  # 1 on the CPU target: torch's single-tensor Adam, not foreach
    fused: ArrayOrNumber  # 1 where megatron steps with Transformer Engine's/Apex's FusedAdam (in place)
    largest: ArrayOrNumber  # elements of the largest parameter tensor, before tensor parallelism


def step_phase(spec: TrainingSpec) -> StepPhase:
    """The step-phase setting of `spec`. Megatron's largest tensors are fused (QKV, gate and up), which
    transformers' modules (`largest_layer`) split."""
    m, t = spec.model, spec.train
    largest = count_params(m).largest_layer
    cpu = device_kind(spec) == "cpu"
    stage: int
    if backend_of(spec).zero_sharding:
        stage = spec.parallel.zero_stage
        fused = False
    else:
        stage = -1
        largest = max(largest, m.vocab_size * m.hidden_size, 2 * m.ffn_hidden_size * m.hidden_size)
        fused = not cpu and t.transformer_impl == "transformer_engine"
    return StepPhase(
        zero_stage=stage,
        fsdp=backend_of(spec).fsdp,
        element_bytes=precision_bytes(t.precision),
        mixed=t.precision != "fp32",
        cpu=cpu,
        fused=fused,
        largest=largest,
    )


def step_phase_bytes(
    ph: StepPhase, params: Any, shards: Any, tp: Any, state: Any, weights_optimizer: Any, held: Any, fixed: Any
) -> Any:
    """The peak of the phases after the backward on one GPU (measured on CPU through the runtime's trainers;
    GPUs differ in Adam alone). `params`: the parameters it holds before optimizer sharding; `state`: its
    weights, gradients and optimizer bytes at the backward peak, `weights_optimizer` those but the gradients
    (each DeepSpeed phase holds gradients of its own); `held`: the layout's buffers; `fixed`: DeepSpeed's
    buffers. Plain arithmetic.

    - Adam's temporaries (fp32): torch's single-tensor step on CPU makes sqrt(v) and its quotient for one
      tensor while the last one's is bound (3 x the largest; 2 x a flat ZeRO partition, its group's one
      tensor); foreach, CUDA's default, one per parameter of the group; FusedAdam none (0 returned: the
      model state alone is under the backward's peak).
    - megatron: DDP reduces in the gradient buffer's own buckets and clips in place: the model state, the
      layout's buffers and Adam's temporaries.
    - ZeRO-0: the engine all-reduces gradients through a flat copy (up to 5e8 elements), then the optimizer
      (under bf16/fp16 DeepSpeed's unfused optimizer, an fp32 copy of every gradient) steps.
    - ZeRO-1/2: the gradient norm casts one gradient to fp64; the partition's gradients (`grads_in_partition`,
      its edge parameter more) are flattened into the fp32 partition's gradient (a 16-bit flat copy first
      under bf16/fp16), then Adam steps on the partition.
    - ZeRO-3: the persistent gradient partition, and per sub-group its flat and fp32 gradients, then Adam.
    - FSDP2: the end of the backward, every sharded gradient made (fp32) beside the last unit's buffers
      (`fixed`), then the step: the root's post-backward frees those, clipping takes per-shard norms and
      Adam steps on each parameter's shard (single-tensor on CPU: 3 x the largest shard)."""
    e, largest = ph.element_bytes, ph.largest / tp
    part = params / shards
    sub = smaller(part, ZERO3_SUB_GROUP_ELEMENTS)
    fp32 = FP32_BYTES

    def adam(group: Any, flat: bool, tensor: Any = largest) -> Any:
        on_cpu = (2 * group) if flat else (3 * tensor)
        return fp32 * pick(ph.cpu, on_cpu, group)

    def megatron() -> Any:
        return state + held + adam(params, flat=False)

    def zero0() -> Any:
        flat_reduce = e * smaller(params, ALLREDUCE_FLAT_ELEMENTS + largest)
        return (
            weights_optimizer
            + held
            + e * params
            + larger(flat_reduce, fp32 * params * ph.mixed + adam(params, flat=False))
        )

    def zero12() -> Any:
        flatten = e * (part + largest) + larger(FP64_BYTES * largest, e * part + fp32 * part * ph.mixed)
        return weights_optimizer + held + fixed + larger(flatten, fp32 * part + adam(part, flat=True))

    def zero3() -> Any:
        step = larger(e * sub + fp32 * sub * ph.mixed, fp32 * sub + adam(sub, flat=True))
        return weights_optimizer + held + fixed + e * part + step

    def fsdp2() -> Any:
        shards_of = pick(stage > 0, shards, 1)
        step = adam(params / shards_of, flat=False, tensor=largest / shards_of)
        return weights_optimizer + fp32 * params / shards_of + held + larger(fixed, step)

    # each branch is priced only where some candidate takes it (compiler/search prices a million at once);
    # megatron's FusedAdam makes nothing, so there its phase is the model state, below the backward's peak: 0
    stage, zero = ph.zero_stage, 1 - ph.fsdp
    branches = (
        ((stage < 0) * (1 - ph.fused), megatron),
        (zero * (stage == 0), zero0),
        (zero * (stage == 3), zero3),
        (zero * ((stage == 1) + (stage == 2)), zero12),
        (ph.fsdp, fsdp2),
    )
    total: Any = 0.0
    for where, price in branches:
        if _anywhere(where):
            total = total + where * price()
    return total


def _anywhere(condition: Any) -> bool:
    """Whether `condition` (a bool, or an array of them) holds anywhere."""
    return bool(condition.any()) if hasattr(condition, "any") else bool(condition)


def fsdp2_workspace(spec: TrainingSpec) -> Workspace:
    """FSDP2's buffers at the backward's peak, as torch 2.13's fully_shard allocates them on torchtitan's units
    (each decoder layer, and the root: embeddings, final norm, head), in the compute dtype c
    (MixedPrecisionPolicy's param_dtype) and the fp32 reduce dtype; L the largest decoder layer's parameters,
    each unit's as one TP rank holds them (FSDP2 gathers a TP shard: the projections, the MLP, the embedding
    and the head divided by tp, the norms whole; `Workspace.split`):

    - the root's weights, gathered in its pre-backward and kept to the end of the backward (the embedding's
      gradient is last), and the head's unsharded gradient beside them: c x (root + head);
    - while a layer runs its backward (`Workspace.layer`: the head's backward, which holds the logits' working
      memory, has ended by then): its gathered weights and their unsharded gradients, c x 2L; the next
      layer's all-gather output, prefetched (FSDP::backward_prefetch), c x L; and the previous layer's
      reduce-scatter input, which FSDP2 keeps until the next reduce-scatter is issued, 4 x L;
    - zero_stage 2 (reshard_after_forward=False): every unit's weights, the root's too, stay gathered from its
      forward to its backward, c per parameter of the stage; the backward then gathers and prefetches
      nothing, and holds the head's and the layer's unsharded gradients and the reduce-scatter input."""
    m, p = spec.model, spec.parallel
    c = precision_bytes(spec.train.precision)
    counts = count_params(m)
    largest = max(range(m.num_layers), key=lambda i: layer_params(m, i).total)
    lp = layer_params(m, largest)
    split_layer = lp.attention + lp.dense_mlp  # MoE layers have no TP plan (refused): their experts stay whole
    whole_layer = lp.total - split_layer
    kept = p.zero_stage == 2

    def root_bytes(root: int, head: int) -> int:
        return c * ((0 if kept else root) + head)

    def layer_state_bytes(layer: int) -> int:
        gathered = 0 if kept else 2 * layer  # the layer in its backward and the one prefetched
        return c * (gathered + layer)

    def layer_bytes(layer: int) -> int:
        return layer_state_bytes(layer) + FP32_BYTES * layer  # and the reduce-scatter input

    return Workspace(
        fixed=root_bytes(counts.final_norm, 0),
        split=root_bytes(counts.embedding + counts.output_head, counts.output_head),
        gathered_bytes=c * kept,
        gathered_cap=counts.total,
        layer=layer_bytes(whole_layer),
        layer_split=layer_bytes(split_layer),
        layer_state=layer_state_bytes(whole_layer),
        layer_state_split=layer_state_bytes(split_layer),
    )


def backend_workspace(spec: TrainingSpec) -> Workspace:
    """The workspace of the spec's backend."""
    if backend_of(spec).fsdp:
        return fsdp2_workspace(spec)
    if backend_of(spec).zero_sharding:
        return deepspeed_workspace(spec)
    return Workspace()


def stage_terms(
    dense: Any,
    expert: Any,
    per_mb: Any,
    working: Any,
    layer_working: Any,
    in_flight: Any,
    dense_state: StateBytes,
    expert_state: StateBytes,
    workspace: Workspace,
    held: Any,
    phase: StepPhase,
    shards: Any,
    tp: Any,
    pp: Any = 1,
) -> tuple[Any, Any, Any, Any, Any, Any]:
    """(weights, gradients, optimizer, activations, workspace, allocator) bytes of one stage's GPU at the
    peak of its step: the backward's, or the gradient reduction's and optimizer step's when that is higher
    (`step_phase_bytes`, its excess counted as workspace). `working`: the largest transient beyond the saved
    activations (`stage_working_bytes`), `layer_working` a layer's (`layer_working_bytes`), beside which the
    workspace's per-layer buffers are counted; `held`: the buffers of its layout
    (`stage_held_bytes`); `shards`: the dense parameters' optimizer shards. Plain arithmetic: `lmspec plan`
    calls it on numpy arrays of candidates (compiler/search)."""
    weights = dense * dense_state.weights + expert * expert_state.weights
    grads = dense * dense_state.gradients + expert * expert_state.gradients
    optim = dense * dense_state.optimizer + expert * expert_state.optimizer
    activations = per_mb * in_flight + working
    per_layer = workspace.layer_at(tp, pp)
    buffers = workspace.at(dense + expert, tp) + held + larger(layer_working + per_layer - working, 0.0)
    backward = weights + grads + optim + activations + buffers
    last_unit = workspace.fixed_at(tp) + per_layer  # the backward's last buffers, as the step phase begins
    state = weights + grads + optim
    after = step_phase_bytes(phase, dense + expert, shards, tp, state, weights + optim, held, last_unit)
    buffers = buffers + larger(after - backward, 0.0)
    allocator = FRAGMENTATION_FRACTION * (weights + grads + optim + activations + buffers)
    return weights, grads, optim, activations, buffers, allocator


def layer_working_bytes(forward: Any, backward: Any, last_head: Any) -> Any:
    """What a decoder layer of the stage adds to the saved activations of its micro-batches in flight while it
    runs: its forward transient (`working_layer_bytes`: MoE dispatch buffers, full recompute's rebuilt layer,
    which runs inside the backward) or the backward of the stage's last layer (`backward_working_bytes`), by
    when the head's activations `last_head` are freed. Plain arithmetic."""
    return larger(forward, larger(backward - last_head, 0.0))


def stage_working_bytes(layer: Any, head: Any) -> Any:
    """What a stage holds at its peak beyond the saved activations of its micro-batches in flight: the larger
    of a layer's transient (`layer_working_bytes`) and the head's backward (`head_working_bytes`, on the last
    stage). Plain arithmetic."""
    return larger(layer, head)


def stage_held_bytes(
    persistent: Any, inputs: Any, micro_batches: Any, pp: Any, stage: Any, virtual_stages: Any, residual: Any
) -> Any:
    """Buffers of a stage's layout beside model state and activations: the backend's persistent buffers
    (`persistent_buffer_bytes`), the step's inputs (`step_input_bytes` per micro-batch) and what the
    pipeline schedule holds (`pipeline_held_bytes`). Plain arithmetic."""
    return persistent + inputs * micro_batches + pipeline_held_bytes(pp, stage, virtual_stages, micro_batches, residual)


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
    dense_state = state_bytes(spec, dims.dense_dp, dims.micro_batches, p.pp)
    expert_state = state_bytes(spec, dims.expert_dp, dims.micro_batches, p.pp)
    act = activation_setting(spec)
    workspace = backend_workspace(spec)
    phase = step_phase(spec)
    persistent = persistent_buffer_bytes(m, act)
    inputs = step_input_bytes(act)
    a2a_overlap = moe_a2a_overlaps(p.overlap.moe_a2a, p.ep, spec.train.recompute == "full", p.pp, p.virtual_stages or 1)
    out: list[StageMemory] = []
    first = 0
    for index, n_layers in enumerate(dims.stage_layers):
        dense, expert = stage_params(layers, counts, first, first + n_layers, p.pp).per_gpu(p.tp, p.ep, p.etp)
        per_mb = 0.0
        forward = backward = 0.0
        for i in range(first, first + n_layers):
            shape = layer_shape(m, is_moe_layer(m, i))
            per_mb += layer_activation_bytes(shape, act)
            forward = max(forward, working_layer_bytes(shape, act))
            backward = max(backward, backward_working_bytes(shape, act))  # each kind the stage holds
        first += n_layers
        if index == 0:
            per_mb += embedding_activation_bytes(act)
        last = index == len(dims.stage_layers) - 1
        head = last_stage_activation_bytes(m, act) if last else 0.0
        per_mb += head
        layer_working = layer_working_bytes(forward, backward, head)
        working = stage_working_bytes(layer_working, head_working_bytes(m, act) if last else 0.0)
        in_flight = float(
            in_flight_micro_batches(p.pp, index, dims.micro_batches, p.virtual_stages or 1, n_layers, a2a_overlap)
        )
        held = stage_held_bytes(
            persistent,
            inputs,
            dims.micro_batches,
            p.pp,
            index,
            p.virtual_stages or 1,
            residual_bytes(m.hidden_size, act),
        )
        weights, grads, optim, activations, buffers, allocator = stage_terms(
            dense,
            expert,
            per_mb,
            working,
            layer_working,
            in_flight,
            dense_state,
            expert_state,
            workspace,
            held,
            phase,
            dims.dense_dp,
            p.tp,
            p.pp,
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
                workspace_bytes=round(buffers),
                allocator_bytes=round(allocator),
                host_bytes=round(dense * dense_state.host + expert * expert_state.host),
            )
        )
    return TrainMemory(stages=tuple(out), budget_bytes=budget_bytes(spec.hardware.gpu.memory_gib))
