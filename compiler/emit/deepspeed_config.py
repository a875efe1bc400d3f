"""ds_config.json: the DeepSpeed engine configuration, emitted only for train.backend=deepspeed.

Every number is concrete (never DeepSpeed/HF "auto"): batch keys from the Plan, bucket sizes
derived from the hidden size exactly as DeepSpeed's HuggingFace integration fills its "auto"
values. DeepSpeed silently accepts unknown top-level keys and optimizer types, so
the emitter only uses names from the tables below, which tests/launch check against
DeepSpeed's own code. It has no `scheduler`: the trainer hands DeepSpeed the spec's schedule
(runtime/train/lr_schedule.py), which none of DeepSpeed's schedulers can express.
"""

from __future__ import annotations

from typing import Any

from lmspec.compiler.backends.deepspeed_buffers import (
    ZERO3_MAX_LIVE_PARAMETERS,
    ZERO3_MAX_REUSE_DISTANCE,
    ZERO3_PERSISTENCE_PER_HIDDEN,
    ZERO3_PREFETCH_FRACTION,
    ZERO3_SUB_GROUP_ELEMENTS,
    bucket_elements,
)
from lmspec.compiler.build.files import DS_CONFIG
from lmspec.compiler.emit.spec_files import dump_json
from lmspec.compiler.plan import Plan

# Top-level keys this emitter may write; tests prove DeepSpeedConfig reads every one.
TOP_LEVEL_KEYS = frozenset(
    {
        "train_batch_size",
        "train_micro_batch_size_per_gpu",
        "gradient_accumulation_steps",
        "steps_per_print",
        "wall_clock_breakdown",
        "bf16",
        "fp16",
        "gradient_clipping",
        "zero_optimization",
        "zero_allow_untested_optimizer",
        "optimizer",
        "activation_checkpointing",
        "checkpoint",
    }
)
# spec optimizer -> (DeepSpeed optimizer type, adam_w_mode or None for non-Adam)
OPTIMIZER_TYPES = {"adamw": ("AdamW", True), "adam": ("Adam", False), "sgd": ("SGD", None)}

# fp16 dynamic loss scaling: DeepSpeed's documented defaults, written out so reviewers see them.
FP16_INITIAL_SCALE_POWER = 16
FP16_LOSS_SCALE_WINDOW_STEPS = 1000
FP16_HYSTERESIS_STEPS = 2
FP16_MIN_LOSS_SCALE = 1


def emit_ds_config(plan: Plan) -> dict[str, str]:
    """The DeepSpeed backend's emitter (lmspec.compiler.backends.deepspeed names it)."""
    return {DS_CONFIG: dump_json(ds_config(plan))}


def ds_config(plan: Plan) -> dict[str, Any]:
    """The config as a dict; `train_batch_size = micro x grad_accum x dp` by construction."""
    t, b = plan.trained().spec.train, plan.trained().batch
    config: dict[str, Any] = {
        "train_batch_size": b.micro_batch_size * b.grad_accum_steps * plan.trained().layout.dp,
        "train_micro_batch_size_per_gpu": b.micro_batch_size,
        "gradient_accumulation_steps": b.grad_accum_steps,
        "steps_per_print": t.log_interval,
        "wall_clock_breakdown": False,
        **_precision(t.precision),
        "gradient_clipping": t.grad_clip,
        "zero_optimization": _zero(plan),
        "optimizer": _optimizer(plan),
        "checkpoint": {"tag_validation": "Warn", "load_universal": False, "use_node_local_storage": False},
    }
    if t.optimizer.name == "sgd" and plan.trained().layout.zero_stage > 0:
        config["zero_allow_untested_optimizer"] = True  # torch SGD is outside ZeRO's tested list
    if t.recompute == "full":  # read by the trainer's deepspeed.checkpointing.configure
        config["activation_checkpointing"] = {
            "partition_activations": False,
            "contiguous_memory_optimization": False,
            "cpu_checkpointing": False,
            "number_checkpoints": plan.spec.model.num_layers,
            "synchronize_checkpoint_boundary": False,
            "profile": False,
        }
    unknown = config.keys() - TOP_LEVEL_KEYS
    if unknown:
        raise RuntimeError(f"ds_config emitter wrote keys outside TOP_LEVEL_KEYS: {sorted(unknown)}")
    return config


def _precision(precision: str) -> dict[str, Any]:
    fp16: dict[str, Any] = {"enabled": precision == "fp16"}
    if precision == "fp16":
        fp16.update(
            loss_scale=0,
            initial_scale_power=FP16_INITIAL_SCALE_POWER,
            loss_scale_window=FP16_LOSS_SCALE_WINDOW_STEPS,
            hysteresis=FP16_HYSTERESIS_STEPS,
            min_loss_scale=FP16_MIN_LOSS_SCALE,
        )
    return {"bf16": {"enabled": precision == "bf16"}, "fp16": fp16}


def _zero(plan: Plan) -> dict[str, Any]:
    stage, p = plan.trained().layout.zero_stage, plan.trained().spec.parallel
    if stage == 0:
        return {"stage": 0}
    hidden = plan.spec.model.hidden_size
    bucket = bucket_elements(hidden)
    zero: dict[str, Any] = {
        "stage": stage,
        "overlap_comm": p.overlap.grad_reduce,
        "contiguous_gradients": True,
        "reduce_bucket_size": bucket,
    }
    if stage in (1, 2):
        zero.update(allgather_partitions=True, allgather_bucket_size=bucket, reduce_scatter=True)
    if stage == 3:
        zero.update(
            # parallel.overlap.param_gather=false: no prefetch, each layer gathers its weights when it runs
            stage3_prefetch_bucket_size=int(ZERO3_PREFETCH_FRACTION * bucket) if p.overlap.param_gather else 0,
            stage3_param_persistence_threshold=ZERO3_PERSISTENCE_PER_HIDDEN * hidden,
            stage3_max_live_parameters=ZERO3_MAX_LIVE_PARAMETERS,
            stage3_max_reuse_distance=ZERO3_MAX_REUSE_DISTANCE,
            sub_group_size=ZERO3_SUB_GROUP_ELEMENTS,
            stage3_gather_16bit_weights_on_model_save=False,
        )
    if p.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if p.offload_params:
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    return zero


def _optimizer(plan: Plan) -> dict[str, Any]:
    o = plan.trained().spec.train.optimizer
    kind, adam_w_mode = OPTIMIZER_TYPES[o.name]
    params: dict[str, Any] = {"lr": o.lr, "weight_decay": o.weight_decay}
    if adam_w_mode is not None:
        params.update(betas=[o.beta1, o.beta2], eps=o.eps, adam_w_mode=adam_w_mode)
        if not plan.trained().spec.parallel.offload_optimizer:
            # torch's Adam/AdamW instead of FusedAdam (CUDA, JIT-compiled); offloaded, DeepSpeed runs its CPU Adam
            params["torch_adam"] = True
    return {"type": kind, "params": params}


def optimizer_summary(plan: Plan) -> str:
    """REPORT.md's line: the optimizer the ds_config asks DeepSpeed for, and the runtime's fallback."""
    o, p = plan.trained().spec.train.optimizer, plan.trained().spec.parallel
    kind, adam_w_mode = OPTIMIZER_TYPES[o.name]
    if adam_w_mode is not None and p.offload_optimizer:
        return f"DeepSpeedCPUAdam ({kind}, offloaded; torch's {kind} where its cpu_adam op cannot be built)"
    return f"torch {kind}"
