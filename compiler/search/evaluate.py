"""Price legal candidates: memory of the worst GPU, step time by term, tokens/s, MFU."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lmspec.compiler.backends import BACKENDS as TRAINING_BACKENDS
from lmspec.compiler.models.comm import dp_grad_bytes
from lmspec.compiler.models.dims import balanced_stages, micro_batches_per_step
from lmspec.compiler.models.flops import flops_breakdown, mfu
from lmspec.compiler.models.stages import last_stage_extra, slowest_stage_work
from lmspec.compiler.models.steptime import StepTime, step_time
from lmspec.compiler.models.steptime_inputs import StepConstants, StepInputs, step_constants
from lmspec.compiler.models.units import precision_bytes
from lmspec.compiler.search.legality import (
    BACKENDS,
    RECOMPUTE,
    Columns,
    backend_property,
    data_parallel,
    dims_of,
    world,
)
from lmspec.compiler.search.memory import stage_table, worst_stage_memory
from lmspec.compiler.spec.sections import TrainingSpec


@dataclass(frozen=True)
class PipelineWork:
    """Per pp (row pp - 1): the slowest stage's work per token and its layers (`stages.slowest_stage_work`)."""

    stage_flops: np.ndarray  # (pp, recompute) hardware FLOPs per token of the slowest stage
    attention_flops: np.ndarray  # core attention FLOPs per token of the most loaded stage
    stage_layers: np.ndarray
    stage_moe_layers: np.ndarray


def pipeline_work(spec: TrainingSpec) -> PipelineWork:
    m, seq = spec.model, spec.train.seq_length
    extra = last_stage_extra(m, seq)
    work = [
        [slowest_stage_work(m, seq, balanced_stages(m.num_layers, pp, extra), r) for r in RECOMPUTE]
        for pp in range(1, m.num_layers + 1)
    ]
    return PipelineWork(
        stage_flops=np.array([[w.hardware_flops for w in row] for row in work]),
        attention_flops=np.array([row[0].attention_flops for row in work]),
        stage_layers=np.array([row[0].layers for row in work]),
        stage_moe_layers=np.array([row[0].moe_layers for row in work]),
    )


@dataclass(frozen=True)
class Priced:
    """Every legal candidate with its worst-GPU memory; those that fit also with their step time.

    `columns`, `memory_bytes`, `worst_stage` and `fits` cover every legal candidate; `feasible`
    and the arrays after it cover only those that fit (a layout over budget needs no timing)."""

    columns: Columns
    memory_bytes: np.ndarray
    worst_stage: np.ndarray
    fits: np.ndarray
    budget_bytes: int
    feasible: Columns  # columns of the candidates that fit, with their memory_bytes and worst_stage
    time: StepTime
    step_time_s: np.ndarray
    tokens_per_s: np.ndarray
    mfu: np.ndarray


def derive(spec: TrainingSpec, c: Columns) -> Columns:
    """Add world, dp and micro-batches per step to the candidate columns."""
    out = Columns(c)
    out["world"] = world(c, spec)
    out["dp"] = data_parallel(c, spec)
    out["micro_batches"] = micro_batches_per_step(spec.train.global_batch_size, c.micro_batch_size, out["dp"])
    return out


def price_inputs(spec: TrainingSpec, f: Columns) -> tuple[StepInputs, StepConstants]:
    """The step-time model's inputs for candidates carrying memory's dense/expert parameter columns."""
    work = pipeline_work(spec)
    s = f.pp - 1
    reduce_in_fp32 = [TRAINING_BACKENDS[b].grad_reduce_in_fp32(spec.train.precision) for b in BACKENDS]
    fp32_gradients = np.array(reduce_in_fp32)[f.backend]
    inputs = StepInputs(
        dims=dims_of(f, spec),
        virtual_stages=f.virtual_stages,
        tokens_per_micro_batch=f.micro_batch_size * spec.train.seq_length,
        sequence_parallel=f.sequence_parallel,
        unfused_kernels=backend_property(f, "hf_model_code"),
        reduces_after_backward=backend_property(f, "reduces_after_backward"),
        gathers_after_step=backend_property(f, "gathers_after_step"),
        reduces_every_micro_batch=backend_property(f, "fsdp"),
        grad_bytes=dp_grad_bytes(fp32_gradients, spec.train.precision),
        element_bytes=precision_bytes(spec.train.precision),
        zero_stage=f.zero_stage,
        distributed_optimizer=f.distributed_optimizer,
        full_recompute=f.recompute == RECOMPUTE.index("full"),
        recompute_attention=f.recompute != RECOMPUTE.index("none"),
        moe_a2a=f.moe_a2a,
        stage_flops_per_token=work.stage_flops[s, f.recompute],
        attention_flops_per_token=work.attention_flops[s],
        stage_layers=work.stage_layers[s],
        stage_moe_layers=work.stage_moe_layers[s],
        dense_params=f.dense_params,
        expert_params=f.expert_params,
    )
    return inputs, step_constants(spec)


def price(spec: TrainingSpec, c: Columns, axes_values: dict[str, np.ndarray]) -> Priced:
    """Price candidates sorted by pp; `axes_values` are the sorted tp, cp and micro-batch values searched."""
    c = derive(spec, c)
    memory = worst_stage_memory(spec, c, stage_table(spec), axes_values)
    fits = memory.total_bytes <= memory.budget_bytes
    f = c.take(fits)
    f.update(
        memory_bytes=memory.total_bytes[fits],
        worst_stage=memory.worst_stage[fits],
        dense_params=memory.dense_params[fits],
        expert_params=memory.expert_params[fits],
    )
    inputs, constants = price_inputs(spec, f)
    time = step_time(inputs, constants)
    total = time.total
    tokens_per_s = spec.train.global_batch_size * spec.train.seq_length / total
    model_flops = flops_breakdown(spec.model, spec.train.seq_length).total
    return Priced(
        columns=c,
        memory_bytes=memory.total_bytes,
        worst_stage=memory.worst_stage,
        fits=fits,
        budget_bytes=memory.budget_bytes,
        feasible=f,
        time=time,
        step_time_s=total,
        tokens_per_s=tokens_per_s,
        mfu=mfu(tokens_per_s, model_flops, f.world, spec.hardware.gpu.bf16_tflops),
    )
