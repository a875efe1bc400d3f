"""What each training target runs: the one capability table.

A target is the code that trains a build: `train.backend`, `train.transformer_impl` and the
device (`Plan.device`: CPU ranks over gloo, or GPUs). A spec asks for features
(`requested_features`); each one its target lacks is refused by a rule (compiler/rules) that names
the key, the capability and the way out; `lmspec plan` searches only layouts its target runs
(compiler/search); the runtime reads the same table where a feature is a choice of
implementation rather than a key (grouped-GEMM experts). Nothing else decides what runs.

Low precision is decided in three steps, each refusal naming its key: the backend and implementation
(`precision_fp8`, `precision_fp4`: Megatron with Transformer Engine only; DeepSpeed and CPU ranks run none),
the hardware's tensor cores (hardware.gpu.fp8_tflops, fp4_tflops), and the recipe's generations
(`recipe_refusal`, from compiler/models/recipes.py's rows, which also give the Transformer Engine release
each recipe needs; the runtime's TE preflight checks the installed one against it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from lmspec.compiler.backends import BACKENDS, BackendName
from lmspec.compiler.models.dims import Device, device_kind
from lmspec.compiler.models.recipes import RECIPES, Recipe, recipe_of
from lmspec.compiler.spec.sections import TrainingSpec

Backend = BackendName
Impl = Literal["local", "transformer_engine"]
Feature = Literal[
    "tensor_parallel",
    "pipeline_parallel",
    "interleaved_pipeline",
    "context_parallel",
    "expert_parallel",
    "expert_tensor_parallel",
    "sequence_parallel",
    "tensor_parallel_without_sp",
    "moe_tensor_parallel",
    "mla_tensor_parallel",
    "mtp",
    "precision_bf16",
    "precision_fp16",
    "precision_fp8",
    "precision_fp4",
    "flash_attention",
    "recompute_selective",
    "recompute_full",
    "zero_1",
    "zero_2",
    "zero_3",
    "distributed_optimizer",
    "offload_optimizer",
    "offload_params",
    "init_from",
    "async_checkpoint",
    "grouped_gemm_experts",
    "tp_comm_overlap",
    "moe_a2a_overlap",
    "moe_allgather_dispatcher",
    "moe_flex_dispatcher",
    "moe_load_balancing_type",
    "moe_aux_loss_coeff",
    "moe_bias_update_rate",
    "moe_capacity_factor",
    "moe_router_dtype",
    "moe_permute_fusion",
    "moe_shared_expert_overlap",
    "moe_force_balance",
]

# feature -> (the key that asks for it, the value that does without it), for the way out of a refusal.
# grouped_gemm_experts is asked for by train.moe.grouped_gemm=true only; with auto the runtime uses it
# wherever the target runs it (`grouped_gemm`). The train.moe features are asked for by a MoE model only:
# on a dense one the keys do nothing (rules/moe_settings.py warns).
FEATURE_KEYS: dict[Feature, tuple[str, object]] = {
    "tensor_parallel": ("parallel.tp", 1),
    "pipeline_parallel": ("parallel.pp", 1),
    "interleaved_pipeline": ("parallel.virtual_stages", None),
    "context_parallel": ("parallel.cp", 1),
    "expert_parallel": ("parallel.ep", 1),
    "expert_tensor_parallel": ("parallel.etp", 1),
    "sequence_parallel": ("parallel.sequence_parallel", False),
    "tensor_parallel_without_sp": ("parallel.sequence_parallel", True),
    "moe_tensor_parallel": ("parallel.tp", 1),
    "mla_tensor_parallel": ("parallel.tp", 1),
    "mtp": ("model.mtp_layers", 0),
    "precision_bf16": ("train.precision", "fp32"),
    "precision_fp16": ("train.precision", "fp32"),
    "precision_fp8": ("train.precision", "bf16"),
    "precision_fp4": ("train.precision", "bf16"),
    "flash_attention": ("train.flash_attention", False),
    "recompute_selective": ("train.recompute", "full"),
    "recompute_full": ("train.recompute", "none"),
    "zero_1": ("parallel.zero_stage", 0),
    "zero_2": ("parallel.zero_stage", 1),
    "zero_3": ("parallel.zero_stage", 2),
    "distributed_optimizer": ("parallel.distributed_optimizer", False),
    "offload_optimizer": ("parallel.offload_optimizer", False),
    "offload_params": ("parallel.offload_params", False),
    "init_from": ("train.init_from", None),
    "async_checkpoint": ("train.checkpoint.async_save", False),
    "tp_comm_overlap": ("parallel.overlap.tp_comm", False),
    "moe_a2a_overlap": ("parallel.overlap.moe_a2a", False),
    "grouped_gemm_experts": ("train.moe.grouped_gemm", "auto"),
    "moe_allgather_dispatcher": ("train.moe.dispatcher", "alltoall"),
    "moe_flex_dispatcher": ("train.moe.dispatcher", "alltoall"),
    "moe_load_balancing_type": ("train.moe.load_balancing", "auto"),
    "moe_aux_loss_coeff": ("train.moe.aux_loss_coeff", 0.001),
    "moe_bias_update_rate": ("train.moe.bias_update_rate", 0.001),
    "moe_capacity_factor": ("train.moe.capacity_factor", None),
    "moe_router_dtype": ("train.moe.router_dtype", "fp32"),
    "moe_permute_fusion": ("train.moe.permute_fusion", False),
    "moe_shared_expert_overlap": ("train.moe.shared_expert_overlap", False),
    "moe_force_balance": ("train.moe.force_balance", False),
}


@dataclass(frozen=True)
class Target:
    backend: Backend
    impl: Impl
    device: Device


@dataclass(frozen=True)
class Capabilities:
    """What a target runs; `lacks` says why each feature it does not run is missing."""

    lacks: dict[Feature, str]

    def runs(self, feature: Feature) -> bool:
        return feature not in self.lacks


# Every backend declares its targets' rows (lmspec.compiler.backends: one module each, with why each feature
# is missing); the table is their union, so a new backend adds its rows in its own module.
TABLE: dict[Target, Capabilities] = {
    Target(name, impl, device): Capabilities(lacks=dict(lacks))
    for name, backend in BACKENDS.items()
    for (impl, device), lacks in backend.targets.items()
}
# Targets that do not exist, and why: the rule's message when a spec names one.
NO_TARGET: dict[tuple[Backend, Impl], str] = {
    (name, impl): why for name, backend in BACKENDS.items() for impl, why in backend.no_target.items()
}


def target_of(spec: TrainingSpec) -> Target:
    return Target(spec.train.backend, spec.train.transformer_impl, device_kind(spec))


def capabilities_of(spec: TrainingSpec) -> Capabilities | None:
    """The spec's target's capabilities; None where no such target exists (NO_TARGET says why)."""
    return TABLE.get(target_of(spec))


def requested_features(spec: TrainingSpec) -> tuple[Feature, ...]:
    """The features a spec asks for, in FEATURE_KEYS' order."""
    p, t, m = spec.parallel, spec.train, spec.model
    moe = t.moe if m.moe is not None else None
    asked: dict[Feature, bool] = {
        "tensor_parallel": p.tp > 1,
        "pipeline_parallel": p.pp > 1,
        "interleaved_pipeline": p.virtual_stages is not None,
        "context_parallel": p.cp > 1,
        "expert_parallel": p.ep > 1,
        "expert_tensor_parallel": p.etp > 1,
        "sequence_parallel": p.sequence_parallel,
        # what a TP plan must cover beyond dense GQA layers with their norms split along the sequence
        "tensor_parallel_without_sp": p.tp > 1 and not p.sequence_parallel,
        "moe_tensor_parallel": p.tp > 1 and m.moe is not None,
        "mla_tensor_parallel": p.tp > 1 and m.attention == "mla",
        "mtp": m.mtp_layers > 0,
        "precision_bf16": t.precision == "bf16",
        "precision_fp16": t.precision == "fp16",
        "precision_fp8": t.precision == "fp8",
        "precision_fp4": t.precision == "fp4",
        "flash_attention": t.flash_attention,
        "recompute_selective": t.recompute == "selective",
        "recompute_full": t.recompute == "full",
        "zero_1": p.zero_stage == 1,
        "zero_2": p.zero_stage == 2,
        "zero_3": p.zero_stage == 3,
        "distributed_optimizer": p.distributed_optimizer,
        "offload_optimizer": p.offload_optimizer,
        "offload_params": p.offload_params,
        "init_from": t.init_from is not None,
        "async_checkpoint": t.checkpoint.async_save,
        "tp_comm_overlap": p.overlap.tp_comm,
        "moe_a2a_overlap": p.overlap.moe_a2a,
        "grouped_gemm_experts": moe is not None and moe.grouped_gemm is True,
        "moe_allgather_dispatcher": moe is not None and moe.dispatcher == "allgather",
        "moe_flex_dispatcher": moe is not None and moe.dispatcher == "flex",
        "moe_load_balancing_type": moe is not None and moe.load_balancing != "auto",
        "moe_aux_loss_coeff": moe is not None and moe.aux_loss_coeff != FEATURE_KEYS["moe_aux_loss_coeff"][1],
        "moe_bias_update_rate": moe is not None and moe.bias_update_rate != FEATURE_KEYS["moe_bias_update_rate"][1],
        "moe_capacity_factor": moe is not None and moe.capacity_factor is not None,
        "moe_router_dtype": moe is not None and moe.router_dtype != "fp32",
        "moe_permute_fusion": moe is not None and moe.permute_fusion,
        "moe_shared_expert_overlap": moe is not None and moe.shared_expert_overlap,
        "moe_force_balance": moe is not None and moe.force_balance,
    }
    return tuple(f for f in FEATURE_KEYS if asked[f])


def grouped_gemm(spec: TrainingSpec) -> bool:
    """Whether the experts run as one grouped GEMM: train.moe.grouped_gemm, auto = wherever the target runs it
    (an explicit true the target cannot run is refused by rules/capability.py)."""
    if spec.model.moe is None:
        return False
    asked = spec.train.moe.grouped_gemm
    if asked != "auto":
        return asked
    caps = capabilities_of(spec)
    return caps is not None and caps.runs("grouped_gemm_experts")


# Features that say how a target runs another one: only a target that runs the other is a way in.
REFINES: dict[Feature, Feature] = dict.fromkeys(
    ("tensor_parallel_without_sp", "moe_tensor_parallel", "mla_tensor_parallel"), "tensor_parallel"
)


def targets_running(feature: Feature, device: Device) -> tuple[Target, ...]:
    """Every target on `device` that runs `feature` (and what it refines): the ways out a refusal names."""
    base = REFINES.get(feature, feature)
    return tuple(t for t, c in TABLE.items() if t.device == device and c.runs(feature) and c.runs(base))


def recipe_refusal(spec: TrainingSpec) -> tuple[Recipe, str] | None:
    """The spec's recipe and why its hardware.gpu.generation does not run it; None where it runs (or no
    recipe is asked for)."""
    recipe = recipe_of(spec)
    generation = spec.hardware.gpu.generation
    if recipe is None or recipe.runs_on(generation):
        return None
    return recipe, recipe.refused[generation]


def recipes_running(precision: str, generation: str) -> tuple[str, ...]:
    """The recipes of `precision` a generation runs: the ways out of a refusal."""
    return tuple(name for name, r in RECIPES.items() if r.precision == precision and r.runs_on(generation))
