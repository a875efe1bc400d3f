"""torchtitan.json: the torchtitan backend's job configuration, emitted only for train.backend=torchtitan.

Its sections and names are torchtitan's (`training.local_batch_size`, `parallelism.
data_parallel_shard_degree`, `parallelism.fsdp_reshard_after_forward`, `checkpoint.interval`, ... as 0.3.0's
config dataclasses name them; `activation_checkpoint.mode`, `optimizer.*`, `model.flavor` as its JobConfig
TOML files did before 0.3.0), so a reviewer who knows torchtitan reads it as one of its own, and every value
is concrete. The trainer (runtime/train/torchtitan) builds from this file and reads every key of it
(tests/launch/test_torchtitan_config.py). Like ds_config.json it has no learning-rate scheduler: the trainer
steps the spec's schedule (compiler/models/lr_schedule.py `lr_at`), which torchtitan's (a warm-up from step
1/(warmup + 1), decay over a ratio of the steps) does not express.
Gradient accumulation is torchtitan's: global_batch_size over local_batch_size x the data-parallel degrees.
parallel.tp is parallelism.tensor_parallel_degree, which torchtitan always runs with sequence parallelism
(the spec says parallel.sequence_parallel=true, compiler/backends/torchtitan.py); loss parallelism is off
(disable_loss_parallel: the trainer gathers the logits whole) and async TP too (it needs CUDA symmetric memory).
train.init_from is checkpoint.initial_load_path, the DCP directory inside that step directory, loaded model-only
(torchtitan's initial_load_model_only); torchtitan's initial_load_in_hf has no key here: a HuggingFace release
becomes such a step directory with `lmspec run BUILD --stage import --from HF_DIR`.
parallel.pp > 1 is torchtitan's pipeline: a step's micro-batches are its schedule's (local_batch_size is the
data-parallel rank's whole step, pipeline_parallel_microbatch_size the plan's micro-batch, so torchtitan's
own accumulation is 1), "1F1B" or, with parallel.virtual_stages, "Interleaved1F1B", and the stage split
(parallel.pp_layout, compiler/models/dims.py stage_layers and chunk_layers) is module_fqns_per_model_part,
torchtitan's list of each stage's modules. Its zero-bubble schedules have no spec key to select them.
"""

from __future__ import annotations

from typing import Any

from lmspec.compiler.build.files import TORCHTITAN_CONFIG, TORCHTITAN_DIR
from lmspec.compiler.emit.spec_files import dump_json
from lmspec.compiler.models.dims import chunk_layers
from lmspec.compiler.plan import Plan

# spec optimizer -> the torch.optim class torchtitan's optimizer.name names
OPTIMIZER_NAMES = {"adamw": "AdamW", "adam": "Adam", "sgd": "SGD"}
# train.precision -> MixedPrecisionPolicy's param_dtype (torchtitan's training.mixed_precision_param)
PARAM_DTYPES = {"fp32": "float32", "bf16": "bfloat16"}
# parallel.zero_stage -> fsdp_reshard_after_forward (FSDP's strategies as ZeRO's stages; 0 replicates)
RESHARD_AFTER_FORWARD = {2: "never", 3: "always"}


def model_parts(stage_layers: tuple[int, ...], virtual_stages: int | None) -> list[list[str]]:
    """torchtitan's module_fqns_per_model_part: each pipeline stage's modules in stage order, stage s on rank
    s mod pp (torchtitan's looped schedules place them so, and Megatron's chunk order is the same:
    dims.chunk_layers), the embedding on the first, the final norm and the head on the last."""
    parts: list[list[str]] = []
    first = 0
    for count in chunk_layers(stage_layers, virtual_stages):
        parts.append([f"model.layers.{i}" for i in range(first, first + count)])
        first += count
    parts[0].insert(0, "model.embed_tokens")
    parts[-1] += ["model.norm", "lm_head"]
    return parts


def emit_torchtitan_config(plan: Plan) -> dict[str, str]:
    """The torchtitan backend's emitter (lmspec.compiler.backends.torchtitan names it)."""
    return {TORCHTITAN_CONFIG: dump_json(torchtitan_config(plan))}


def torchtitan_config(plan: Plan) -> dict[str, Any]:
    trained = plan.trained()
    s, b, layout = trained.spec, trained.batch, trained.layout
    t, o = s.train, s.train.optimizer
    sharded = layout.zero_stage > 0
    pipelined = layout.pp > 1
    return {
        "job": {"description": plan.name},
        "model": {"name": s.model.family, "flavor": s.model.name},
        "training": {
            # with a pipeline, the data-parallel rank's whole step: the schedule runs its micro-batches
            "local_batch_size": b.micro_batch_size * (b.grad_accum_steps if pipelined else 1),
            "global_batch_size": t.global_batch_size,
            "seq_len": t.seq_length,
            "steps": t.steps,
            "max_norm": t.grad_clip,
            "mixed_precision_param": PARAM_DTYPES[t.precision],
            "mixed_precision_reduce": "float32",
            "seed": t.seed,
        },
        "optimizer": {
            "name": OPTIMIZER_NAMES[o.name],
            "lr": o.lr,
            "eps": o.eps,
            "beta1": o.beta1,
            "beta2": o.beta2,
            "weight_decay": o.weight_decay,
        },
        "parallelism": {
            "data_parallel_replicate_degree": 1 if sharded else layout.dp,
            "data_parallel_shard_degree": layout.dp if sharded else 1,
            "fsdp_reshard_after_forward": RESHARD_AFTER_FORWARD.get(layout.zero_stage, "default"),
            "tensor_parallel_degree": layout.tp,  # with sequence parallelism, as torchtitan always applies it
            "disable_loss_parallel": True,  # the head's logits gathered whole
            "enable_async_tensor_parallel": False,
            "pipeline_parallel_degree": layout.pp,
            "pipeline_parallel_schedule": "Interleaved1F1B" if layout.virtual_stages else "1F1B",
            "pipeline_parallel_microbatch_size": b.micro_batch_size,
            "module_fqns_per_model_part": (
                model_parts(layout.stage_layers, layout.virtual_stages) if pipelined else None
            ),
            "context_parallel_degree": layout.cp,
        },
        # train.recompute's values are torchtitan's modes; selective is its per-op policy
        "activation_checkpoint": {"mode": t.recompute, "selective_ac_option": "op"},
        "checkpoint": {
            "enable": True,
            "folder": t.checkpoint.dir,
            "interval": t.checkpoint.interval,
            "keep_latest_k": t.checkpoint.keep_last_k,
            "async_mode": "async" if t.checkpoint.async_save else "disabled",
            "initial_load_path": None if t.init_from is None else f"{t.init_from.rstrip('/')}/{TORCHTITAN_DIR}",
            "initial_load_model_only": True,
        },
        "compile": {"enable": False},
    }
