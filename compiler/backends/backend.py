"""What a training backend is: the framework that trains a build, and everything lmspec must know of it.

A backend is one module here (lmspec.compiler.backends.<name>) holding one `TrainingBackend`; the registry in
lmspec.compiler.backends names it. Everything outside those modules asks the record
(`backend_of(spec)`) instead of comparing `train.backend` with a name, so a new backend is a module, its
templates, its runtime trainer, its tests and a preset (tests/compiler/test_plugin_names.py holds that).
The record is plain data: what the compiler and the runtime import from it lazily (its emitter, its
trainer, its verify reference) is named as "module:attribute", so the registry imports neither the Plan
nor torch, and the cost model, the rules and the runtime can all import it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lmspec.compiler.errors import Problem

if TYPE_CHECKING:  # the rules package and the capability table read these: only types cross back
    from lmspec.compiler.capabilities import Feature, Impl
    from lmspec.compiler.models.dims import Device
    from lmspec.compiler.rules.context import TrainingContext

    TrainingRule = Callable[[TrainingContext], Iterator[Problem]]


@dataclass(frozen=True)
class TrainingBackend:
    """One value of `train.backend`; each field is what some rule, model, emitter or stage asks of it."""

    name: str  # its `train.backend` value, the registry's key
    # the capability table's rows (lmspec.compiler.capabilities): (train.transformer_impl, device) -> each
    # feature that target lacks and why; an impl with no row is no target, `no_target` says why
    targets: Mapping[tuple[Impl, Device], Mapping[Feature, str]]
    no_target: Mapping[Impl, str]
    rules: tuple[TrainingRule, ...]  # what it refuses beyond the capability table
    emitter: str  # "module:function", Plan -> {build file: text}: its reviewed configuration
    config_file: str  # the one of those files its trainer builds from
    trainer: str  # "module:class" the runtime trains with: (spec, plan, config document)
    reference_outputs: str  # "module:function" verify compares a converted model with: (build, step dir, tokens)
    checkpoint_dir: str  # what it saves inside each checkpoint step directory
    checkpoint_format: str  # convert/mapping.json's checkpoint_format: what the converter reads
    # shards optimizer state with ZeRO stages (parallel.zero_stage: gradients at 2, weights at 3; gathers a
    # layer's weights at a time at 3), or else with Megatron's distributed optimizer (parallel.distributed_optimizer)
    zero_sharding: bool
    # the step-time model's DP overlap: replicated gradients (zero_stage 0) all-reduced after the backward, not
    # bucket by bucket inside it (DeepSpeed's engine); sharded weights gathered after the optimizer step, not
    # prefetched in the next forward (DeepSpeed's ZeRO-1/2)
    reduces_after_backward: bool
    gathers_after_step: bool
    # shards as FSDP2 does under torchtitan (per-parameter DTensor shards in the parameters' own dtype, one
    # FSDP unit's weights gathered at a time in the compute dtype, every micro-batch reducing its gradients
    # into the shards: no accumulation of unsharded gradients): the memory model prices
    # fsdp2_state_bytes/fsdp2_workspace, the step-time model a sync per micro-batch (comm.dp_traffic)
    fsdp: bool
    # runs transformers' modeling code: unfused kernels, no selective recompute of its own, the HF
    # activation layout; else megatron-core's fused layers
    hf_model_code: bool
    grad_reduce_in_fp32: Callable[[str], bool]  # train.precision -> whether gradients travel in fp32
    moe_tp_needs_sequence_parallel: bool  # refuses MoE layers under tensor parallelism without SP
    one_cuda_work_queue: bool  # overlaps TP communication with GEMMs: CUDA_DEVICE_MAX_CONNECTIONS=1
    sharding_summary: Callable[[int, bool], str]  # (zero_stage, distributed_optimizer) -> REPORT.md's line
    sharding_label: Callable[[int, bool], str]  # the same, as `lmspec plan`'s table column says it
    optimizer_summary: str | None  # "module:function", Plan -> REPORT.md's optimizer line, where it chooses one
    # pipeline stages are torch.distributed.pipelining modules (torchtitan): every stage, virtual ones too, holds a
    # decoder layer, no weight is tied across stages, and 1F1B runs at least as many micro-batches as stages
    # (its rules say so; compiler/search mirrors them)
    pipeline_stage_modules: bool
    # "module:function" (trainer, convert/mapping.json, HF dir) -> Imported: what `lmspec run --stage import`
    # loads a released HuggingFace directory into its trainer's model with; None where it has none
    hf_importer: str | None

    @property
    def imports_hf(self) -> bool:
        return self.hf_importer is not None

    @property
    def sharding_key(self) -> str:
        return "parallel.zero_stage" if self.zero_sharding else "parallel.distributed_optimizer"


def load(reference: str) -> Any:
    """The attribute a "module:attribute" field names, imported on first use."""
    module, _, attribute = reference.partition(":")
    return getattr(importlib.import_module(module), attribute)
