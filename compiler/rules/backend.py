"""Rules of each training backend that the capability table (rules/capability.py) cannot express."""

from __future__ import annotations

from collections.abc import Iterator

from lmspec.compiler.errors import Problem, error, warning
from lmspec.compiler.rules.context import TrainingContext


def offload_needs_zero_stage(ctx: TrainingContext) -> Iterator[Problem]:
    """DeepSpeed offloads what ZeRO partitions: optimizer states from stage 1, parameters at stage 3.
    (Offload on Megatron is refused by capability.target_runs_spec.)"""
    s, p = ctx.spec, ctx.spec.parallel
    if s.train.backend != "deepspeed":
        return
    for key, needed in (("parallel.offload_optimizer", 1), ("parallel.offload_params", 3)):
        if ctx.value(key) and p.zero_stage < needed:
            yield error(key, f"{ctx.show(key)} needs parallel.zero_stage>={needed} ({ctx.show('parallel.zero_stage')})")


def megatron_sequence_parallel_hint(ctx: TrainingContext) -> Iterator[Problem]:
    s = ctx.spec
    dense = s.model.moe is None  # MoE under TP needs it outright (experts.moe_tensor_parallel_needs_...)
    if s.train.backend == "megatron" and dense and s.parallel.tp > 1 and not s.parallel.sequence_parallel:
        yield warning(
            "parallel.sequence_parallel",
            (
                f"{ctx.show('parallel.sequence_parallel')} with {ctx.show('parallel.tp')}: activations of norms and "
                "dropout are replicated on every TP rank; parallel.sequence_parallel=true divides them by tp"
            ),
        )


# megatron-core 0.16.1's RotaryEmbedding._apply_scaling takes only the factor (GPTModel's
# rope_scaling_factor); Llama-3.1's band limits and pretraining length are its defaults, fixed.
MEGATRON_LLAMA3_FIXED = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def megatron_rope_scaling_runs(ctx: TrainingContext) -> Iterator[Problem]:
    """The rope scaling megatron-core 0.16.1's GPTModel can apply to GQA attention: llama3 at Llama-3.1's
    fixed band (factor free) and linear (seq_len_interpolation_factor); YaRN only with MLA (DeepSeek)."""
    s, rs = ctx.spec, ctx.spec.model.rope_scaling
    if s.train.backend != "megatron" or rs is None or s.model.attention != "gqa":
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
    for name, fixed in MEGATRON_LLAMA3_FIXED.items():
        path = f"model.rope_scaling.{name}"
        if getattr(rs, name) != fixed:
            yield error(
                path,
                (
                    f"{ctx.show(path)}: megatron-core 0.16.1 applies llama3 rope scaling only with {name}={fixed} "
                    "(RotaryEmbedding._apply_scaling fixes it); use train.backend=deepspeed for this model"
                ),
            )


RULES = (offload_needs_zero_stage, megatron_sequence_parallel_hint, megatron_rope_scaling_runs)
