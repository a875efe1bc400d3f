"""What each training target runs: the one capability table.

A target is the code that trains a build: `train.backend`, `train.transformer_impl` and the
device (`Plan.device`: CPU ranks over gloo, or GPUs). A spec asks for features
(`requested_features`); each one its target lacks is refused by a rule (compiler/rules) that names
the key, the capability and the way out; `lmspec plan` searches only layouts its target runs
(compiler/search); the runtime reads the same table where a feature is a choice of
implementation rather than a key (grouped-GEMM experts). Nothing else decides what runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from lmspec.compiler.plan import Device, device_kind
from lmspec.compiler.spec.sections import TrainingSpec

Backend = Literal["megatron", "deepspeed"]
Impl = Literal["local", "transformer_engine"]
Feature = Literal[
    "tensor_parallel",
    "pipeline_parallel",
    "interleaved_pipeline",
    "context_parallel",
    "expert_parallel",
    "expert_tensor_parallel",
    "sequence_parallel",
    "mtp",
    "precision_bf16",
    "precision_fp16",
    "precision_fp8",
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
    "grouped_gemm_experts",
    "tp_comm_overlap",
    "moe_a2a_overlap",
]

# feature -> (the key that asks for it, the value that does without it), for the way out of a refusal.
# grouped_gemm_experts has no key: the runtime uses it wherever the target runs it.
FEATURE_KEYS: dict[Feature, tuple[str, object]] = {
    "tensor_parallel": ("parallel.tp", 1),
    "pipeline_parallel": ("parallel.pp", 1),
    "interleaved_pipeline": ("parallel.virtual_stages", None),
    "context_parallel": ("parallel.cp", 1),
    "expert_parallel": ("parallel.ep", 1),
    "expert_tensor_parallel": ("parallel.etp", 1),
    "sequence_parallel": ("parallel.sequence_parallel", False),
    "mtp": ("model.mtp_layers", 0),
    "precision_bf16": ("train.precision", "fp32"),
    "precision_fp16": ("train.precision", "fp32"),
    "precision_fp8": ("train.precision", "bf16"),
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
    "tp_comm_overlap": ("parallel.overlap.tp_comm", False),
    "moe_a2a_overlap": ("parallel.overlap.moe_a2a", False),
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


_MEGATRON_CPU = "megatron-core's mixed-precision optimizer and distributed optimizer accept only CUDA tensors"
_NO_USERBUFFERS = (
    "lmspec's Megatron trainer does not set up Transformer Engine's userbuffers, which Megatron-LM's "
    "--tp-comm-overlap initialises before building the model"
)
_LOCAL = "megatron-core's local (pure-PyTorch) implementation"
_HF = "lmspec's DeepSpeed trainer (transformers' modeling code under ZeRO data parallelism)"

_MEGATRON_LOCAL: dict[Feature, str] = {
    "context_parallel": f"{_LOCAL} has no context-parallel attention",
    "precision_fp8": "FP8 GEMMs come from Transformer Engine",
    "flash_attention": f"{_LOCAL} materialises the s x s attention scores (Transformer Engine fuses them)",
    "grouped_gemm_experts": f"{_LOCAL} runs the experts one after another (SequentialMLP)",
    "zero_1": "ZeRO stages are DeepSpeed's; Megatron shards optimizer states with parallel.distributed_optimizer",
    "zero_2": "ZeRO stages are DeepSpeed's; Megatron shards optimizer states with parallel.distributed_optimizer",
    "zero_3": "ZeRO stages are DeepSpeed's; Megatron shards optimizer states with parallel.distributed_optimizer",
    "offload_optimizer": "optimizer offload is DeepSpeed's (ZeRO-Offload)",
    "offload_params": "parameter offload is DeepSpeed's (ZeRO-Infinity)",
    "tp_comm_overlap": _NO_USERBUFFERS,
}
_MEGATRON_TE: dict[Feature, str] = {
    k: v for k, v in _MEGATRON_LOCAL.items() if k not in ("context_parallel", "precision_fp8", "flash_attention")
}
_MEGATRON_TE.pop("grouped_gemm_experts")
_DEEPSPEED: dict[Feature, str] = {
    "tensor_parallel": f"{_HF} is data parallel only (shard with parallel.zero_stage)",
    "pipeline_parallel": f"{_HF} is data parallel only (shard with parallel.zero_stage)",
    "interleaved_pipeline": f"{_HF} has no pipeline",
    "context_parallel": f"{_HF} is data parallel only",
    "expert_parallel": f"{_HF} is data parallel only",
    "expert_tensor_parallel": f"{_HF} is data parallel only",
    "sequence_parallel": f"{_HF} has no tensor parallelism to split sequences over",
    "mtp": "transformers' modeling code does not build multi-token-prediction modules",
    "precision_fp8": "FP8 GEMMs come from Transformer Engine, which transformers' modeling code does not use",
    "recompute_selective": "transformers' gradient checkpointing recomputes whole layers (train.recompute=full)",
    "grouped_gemm_experts": "transformers' MoE blocks loop over their experts",
    "tp_comm_overlap": f"{_HF} has no tensor parallelism",
    "moe_a2a_overlap": f"{_HF} has no expert parallelism",
    "distributed_optimizer": "the distributed optimizer is Megatron's; DeepSpeed shards with parallel.zero_stage",
    "init_from": "it initialises from train.seed; a lmspec torch_dist checkpoint is Megatron's format",
}

TABLE: dict[Target, Capabilities] = {
    Target("megatron", "local", "cpu"): Capabilities(
        lacks={
            **_MEGATRON_LOCAL,
            "precision_bf16": _MEGATRON_CPU,
            "moe_a2a_overlap": "megatron-core's combined 1F1B schedule runs the all-to-alls on CUDA streams",
            "precision_fp16": _MEGATRON_CPU,
            "distributed_optimizer": _MEGATRON_CPU,
            "expert_tensor_parallel": (
                "megatron-core's token dispatcher all-gathers uneven token counts over the expert tensor-parallel "
                "group, which gloo cannot (the parity sweep's ep/etp layouts)"
            ),
        }
    ),
    Target("megatron", "local", "gpu"): Capabilities(lacks=dict(_MEGATRON_LOCAL)),
    Target("megatron", "transformer_engine", "gpu"): Capabilities(lacks=dict(_MEGATRON_TE)),
    Target("deepspeed", "local", "cpu"): Capabilities(
        lacks={
            **_DEEPSPEED,
            "precision_fp16": "DeepSpeed's CPU accelerator has fp16 kernels only where oneDNN provides them",
        }
    ),
    Target("deepspeed", "local", "gpu"): Capabilities(lacks=dict(_DEEPSPEED)),
}
# Targets that do not exist, and why: the rule's message when a spec names one.
NO_TARGET: dict[tuple[Backend, Impl], str] = {
    ("megatron", "transformer_engine"): "Transformer Engine runs on NVIDIA GPUs only; set train.transformer_impl=local",
    ("deepspeed", "transformer_engine"): (
        "lmspec's DeepSpeed trainer runs transformers' PyTorch modeling code, not Transformer Engine; "
        "set train.transformer_impl=local"
    ),
}


def target_of(spec: TrainingSpec) -> Target:
    return Target(spec.train.backend, spec.train.transformer_impl, device_kind(spec))


def capabilities_of(spec: TrainingSpec) -> Capabilities | None:
    """The spec's target's capabilities; None where no such target exists (NO_TARGET says why)."""
    return TABLE.get(target_of(spec))


def requested_features(spec: TrainingSpec) -> tuple[Feature, ...]:
    """The features a spec asks for, in FEATURE_KEYS' order."""
    p, t, m = spec.parallel, spec.train, spec.model
    asked: dict[Feature, bool] = {
        "tensor_parallel": p.tp > 1,
        "pipeline_parallel": p.pp > 1,
        "interleaved_pipeline": p.virtual_stages is not None,
        "context_parallel": p.cp > 1,
        "expert_parallel": p.ep > 1,
        "expert_tensor_parallel": p.etp > 1,
        "sequence_parallel": p.sequence_parallel,
        "mtp": m.mtp_layers > 0,
        "precision_bf16": t.precision == "bf16",
        "precision_fp16": t.precision == "fp16",
        "precision_fp8": t.precision == "fp8",
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
        "tp_comm_overlap": p.overlap.tp_comm,
        "moe_a2a_overlap": p.overlap.moe_a2a,
    }
    return tuple(f for f in FEATURE_KEYS if asked[f])


def targets_running(feature: Feature, device: Device) -> tuple[Target, ...]:
    """Every target on `device` that runs `feature`: the ways out a refusal names."""
    return tuple(t for t, c in TABLE.items() if t.device == device and c.runs(feature))
