"""Rules of the parallel layout: world size, divisibility by tp/pp/cp, TP inside a node."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from lmspec.compiler.backends import backend_of
from lmspec.compiler.errors import Problem, error, warning
from lmspec.compiler.models.dims import (
    ParallelDims,
    balanced_stages,
    divisors,
    domain_gpus_of,
    model_parallel_size,
    next_multiple_above,
    stage_layers,
    world_size,
)
from lmspec.compiler.models.stages import last_stage_extra
from lmspec.compiler.rules.context import TrainingContext, listed

# beyond this TP's GEMMs get thin and each layer's all-reduces grow against them, even on NVLink
TP_WIDTH_WARNING = 8


# Conditions of the rules below as plain arithmetic, true where legal: they take ints or numpy
# arrays alike, so `lmspec plan` drops exactly what these rules reject (compiler/search).
def world_divides(world: Any, tp: Any, pp: Any, cp: Any) -> Any:
    return world % (tp * pp * cp) == 0


def tp_divides_heads(heads: Any, tp: Any) -> Any:
    return heads % tp == 0


def kv_heads_split_evenly(kv_heads: Any, tp: Any) -> Any:
    # megatron-core divides the key/value groups over the TP ranks (it asserts, never replicates)
    return kv_heads % tp == 0


def tp_splits_widths(ffn_hidden_size: Any, vocab_size: Any, tp: Any) -> Any:
    # column-parallel MLP and vocab-parallel embedding/head: both shard evenly or not at all
    return (ffn_hidden_size % tp == 0) & (vocab_size % tp == 0)


def stages_have_layers(num_layers: Any, pp: Any) -> Any:
    return pp <= num_layers


def tp_within_domain(tp: Any, domain_gpus: Any) -> Any:
    return tp <= domain_gpus


def cp_splits_sequence(seq_length: Any, cp: Any) -> Any:
    return (cp == 1) | (seq_length % (2 * cp) == 0)


def cp_has_flash_attention(cp: Any, flash_attention: Any) -> Any:
    return (cp == 1) | (flash_attention != 0)


def some_stage_fills_its_chunks(longest_stage_layers: Any, virtual_stages: Any) -> Any:
    # past the longest stage's layers every stage has a chunk without a layer (dims.chunk_layers)
    return virtual_stages <= longest_stage_layers


def interleaved_micro_batches_fit(micro_batches: Any, pp: Any) -> Any:
    # megatron-core 0.16.1's interleaved schedule (pipeline_parallel/schedules.py:995-1015) runs groups of
    # microbatch_group_size_per_vp_stage = pp micro-batches: it raises unless M >= pp and M mod pp is 0 or >= pp
    return micro_batches % pp == 0


def sequence_parallel_has_tp(sequence_parallel: Any, tp: Any) -> Any:
    return (sequence_parallel == 0) | (tp > 1)


def world_size_matches(ctx: TrainingContext) -> Iterator[Problem]:
    s = ctx.spec
    world = world_size(s.hardware.gpus_per_node, s.hardware.nodes)
    world_factors = f"{ctx.factor('hardware.gpus_per_node')} x {ctx.factor('hardware.nodes')} = {world}"
    mp = model_parallel_size(s.parallel.tp, s.parallel.pp, s.parallel.cp)
    mp_factors = f"{ctx.factor('parallel.tp')} x {ctx.factor('parallel.pp')} x {ctx.factor('parallel.cp')}"
    if s.parallel.dp == "auto":
        if not world_divides(world, s.parallel.tp, s.parallel.pp, s.parallel.cp):
            # the next node count whose world divides by mp: a multiple of mp / gcd(gpus_per_node, mp)
            fits = next_multiple_above(s.hardware.nodes, mp // math.gcd(s.hardware.gpus_per_node, mp))
            fix = f"set hardware.nodes={fits}"
            yield error(
                "parallel.dp",
                (
                    f"parallel.dp=auto cannot be derived: {mp_factors} = {mp} does not divide the world size "
                    f"{world_factors} ({ctx.sources('parallel.tp', 'parallel.pp', 'hardware.nodes')}); "
                    f"{fix}, or choose tp x pp x cp among {listed(divisors(world))}"
                ),
            )
        return
    product = mp * int(s.parallel.dp)
    if product != world:
        yield error(
            "parallel.dp",
            (
                f"{mp_factors} x {ctx.factor('parallel.dp')} = {product} != world size {world_factors} "
                f"({ctx.sources('parallel.dp', 'hardware.nodes')}); set parallel.dp=auto"
                + (f" (gives {world // mp})" if world % mp == 0 else "")
            ),
        )


def heads_divide_by_tp(ctx: TrainingContext) -> Iterator[Problem]:
    heads, tp = ctx.spec.model.num_attention_heads, ctx.spec.parallel.tp
    if not tp_divides_heads(heads, tp):
        yield error(
            "parallel.tp",
            (
                f"{ctx.show('parallel.tp')} does not divide {ctx.show('model.num_attention_heads')}; "
                f"valid: {listed(divisors(heads))}"
            ),
        )


def kv_heads_fit_tp(ctx: TrainingContext) -> Iterator[Problem]:
    m, tp = ctx.spec.model, ctx.spec.parallel.tp
    if m.attention == "gqa" and not kv_heads_split_evenly(m.num_kv_heads, tp):
        valid = [d for d in divisors(m.num_attention_heads) if m.num_kv_heads % d == 0]
        yield error(
            "parallel.tp",
            (
                f"{ctx.show('parallel.tp')} does not divide {ctx.show('model.num_kv_heads')}: megatron-core splits "
                f"the key/value groups over the TP ranks and cannot replicate them; valid: {listed(valid)}"
            ),
        )


def widths_divide_by_tp(ctx: TrainingContext) -> Iterator[Problem]:
    m, tp = ctx.spec.model, ctx.spec.parallel.tp
    if not tp_splits_widths(m.ffn_hidden_size, m.vocab_size, tp):
        uneven = [key for key in ("model.ffn_hidden_size", "model.vocab_size") if ctx.value(key) % tp]
        valid = [d for d in divisors(m.num_attention_heads) if tp_splits_widths(m.ffn_hidden_size, m.vocab_size, d)]
        yield error(
            "parallel.tp",
            (
                f"{ctx.show('parallel.tp')} does not divide {' or '.join(ctx.show(k) for k in uneven)}: the "
                f"column-parallel MLP and the vocabulary-parallel embedding and output head shard evenly over "
                f"the TP ranks; valid: {listed(valid)}"
            ),
        )


def layers_fit_pipeline(ctx: TrainingContext) -> Iterator[Problem]:
    m, p = ctx.spec.model, ctx.spec.parallel
    layout = p.pp_layout
    if layout is None and m.num_layers % p.pp:
        auto_stages = balanced_stages(m.num_layers, p.pp, last_stage_extra(m, ctx.spec.train.seq_length))
        yield error(
            "parallel.pp",
            (
                f"{ctx.show('parallel.pp')} does not divide {ctx.show('model.num_layers')}; "
                f"valid: {listed(divisors(m.num_layers))}, or set parallel.pp_layout=auto "
                f"(uneven stages {list(auto_stages) if m.num_layers >= p.pp else ''})"
            ),
        )
    elif layout == "auto" and not stages_have_layers(m.num_layers, p.pp):
        yield error(
            "parallel.pp", f"{ctx.show('parallel.pp')} exceeds {ctx.show('model.num_layers')}: a stage needs a layer"
        )
    elif isinstance(layout, tuple):
        if len(layout) != p.pp or sum(layout) != m.num_layers or min(layout) < 1:
            yield error(
                "parallel.pp_layout",
                (
                    f"{ctx.show('parallel.pp_layout')} must list {p.pp} stages ({ctx.show('parallel.pp')}), each >= 1, "
                    f"summing to {ctx.show('model.num_layers')}; it has {len(layout)} summing to {sum(layout)}; "
                    "or use parallel.pp_layout=auto"
                ),
            )


def virtual_stages_fit(ctx: TrainingContext) -> Iterator[Problem]:
    """What megatron-core 0.16.1 builds and schedules for interleaved 1F1B: more than one chunk per rank,
    and micro-batches in whole groups of pp (its schedule raises when a step's count is not a multiple
    of pp). The chunks need not be equal: lmspec writes `pipeline_model_parallel_layout`, whose class
    (transformer/pipeline_parallel_layer_layout.py) asks only that it list pp x v chunks, and splits each
    stage's layers as evenly as possible (compiler.models.dims.chunk_layers)."""
    p = ctx.spec.parallel
    vp = p.virtual_stages
    if vp is None:
        return
    if p.pp == 1:
        yield error(
            "parallel.virtual_stages",
            f"{ctx.show('parallel.virtual_stages')} needs {ctx.show('parallel.pp')} > 1; set it to null",
        )
        return
    if vp == 1:
        yield error(
            "parallel.virtual_stages",
            f"{ctx.show('parallel.virtual_stages')} is one model chunk per rank, which is plain 1F1B; set it to null, "
            "or to 2 or more for interleaved 1F1B",
        )
        return
    dims = ParallelDims.from_spec(ctx.spec)
    if dims is not None and not interleaved_micro_batches_fit(dims.micro_batches, p.pp):
        per_step = ctx.spec.train.micro_batch_size * dims.dp
        fits = next_multiple_above(ctx.spec.train.global_batch_size - 1, per_step * p.pp)
        yield error(
            "parallel.virtual_stages",
            (
                f"{ctx.show('parallel.virtual_stages')}: megatron-core's interleaved 1F1B runs a step's micro-batches "
                f"in groups of {ctx.factor('parallel.pp')}, but a step has {dims.micro_batches} "
                f"({ctx.factor('train.global_batch_size')} / ({ctx.factor('train.micro_batch_size')} "
                f"x dp({dims.dp}))), "
                f"not a multiple of {p.pp}; set train.global_batch_size={fits} (a multiple of "
                f"{per_step} x {p.pp}), or parallel.virtual_stages=null"
            ),
        )


def virtual_stages_have_layers(ctx: TrainingContext) -> Iterator[Problem]:
    """More chunks than the longest stage has layers: megatron-core builds the surplus as empty chunks, so
    every stage runs one that only passes activations on (a pipeline hop, no shorter bubble)."""
    p = ctx.spec.parallel
    stages = stage_layers(ctx.spec)
    if p.virtual_stages is None or p.pp == 1 or stages is None:
        return  # virtual_stages_fit or layers_fit_pipeline says why
    if not some_stage_fills_its_chunks(max(stages), p.virtual_stages):
        split = (
            ctx.show("parallel.pp_layout")
            if p.pp_layout is not None
            else f"{ctx.show('model.num_layers')} / {ctx.show('parallel.pp')}"
        )
        longest = max(stages)
        fix = (
            f"set parallel.virtual_stages to at most {longest} (the longest stage's layers), or to null"
            if longest >= 2
            else "set it to null: a stage of one layer is one chunk"
        )
        yield warning(
            "parallel.virtual_stages",
            (
                f"{ctx.show('parallel.virtual_stages')} splits each pipeline stage into {p.virtual_stages} model "
                f"chunks, but the stages hold {list(stages)} layers ({split}), so every stage runs a chunk without "
                f"a layer (megatron-core builds it empty): it adds pipeline hops and shortens no bubble; {fix}"
            ),
        )


def tp_inside_nvlink_domain(ctx: TrainingContext) -> Iterator[Problem]:
    """TP all-reduces every layer: it stays where the intra-node link reaches, one node or the part of a
    rack's NVLink domain the job fills (hardware.nvlink_domain, models.dims.domain_gpus_of)."""
    tp, hw = ctx.spec.parallel.tp, ctx.spec.hardware
    domain = domain_gpus_of(hw)
    if not tp_within_domain(tp, domain):
        where = (
            f"nodes ({ctx.show('hardware.gpus_per_node')})"
            if domain == hw.gpus_per_node
            else f"its NVLink domain ({domain} GPUs of {ctx.show('hardware.nvlink_domain')} on "
            f"{ctx.show('hardware.nodes')})"
        )
        yield error(
            "parallel.tp",
            (
                f"{ctx.show('parallel.tp')} crosses {where}: every layer's all-reduce would go over the "
                f"inter-node network; keep tp <= {domain} and add parallel.pp or dp"
            ),
        )
    elif tp > TP_WIDTH_WARNING:
        yield warning(
            "parallel.tp",
            (
                f"{ctx.show('parallel.tp')} > {TP_WIDTH_WARNING}: each GPU's GEMMs get thin and every layer's "
                f"all-reduces grow against them, even over NVLink; prefer tp <= {TP_WIDTH_WARNING} with pp or ep"
            ),
        )


def cp_divides_sequence(ctx: TrainingContext) -> Iterator[Problem]:
    cp, seq = ctx.spec.parallel.cp, ctx.spec.train.seq_length
    if not cp_splits_sequence(seq, cp):
        yield error(
            "parallel.cp",
            (
                f"{ctx.show('train.seq_length')} must divide by 2 x {ctx.show('parallel.cp')} "
                "(causal load balancing splits each sequence into 2 x cp chunks)"
            ),
        )


def cp_needs_flash_attention(ctx: TrainingContext) -> Iterator[Problem]:
    """Ring attention merges flash attention's partial outputs by their log-sum-exp: Transformer Engine offers
    context parallelism with its flash and fused attention backends only, not the unfused one."""
    if not cp_has_flash_attention(ctx.spec.parallel.cp, ctx.spec.train.flash_attention):
        yield error(
            "parallel.cp",
            (
                f"{ctx.show('parallel.cp')} runs ring attention, which needs flash attention, but "
                f"{ctx.show('train.flash_attention')}; set train.flash_attention=true or parallel.cp=1"
            ),
        )


def sequence_parallel_needs_tp(ctx: TrainingContext) -> Iterator[Problem]:
    if not sequence_parallel_has_tp(ctx.spec.parallel.sequence_parallel, ctx.spec.parallel.tp):
        yield warning(
            "parallel.sequence_parallel",
            (
                f"{ctx.show('parallel.sequence_parallel')} has no effect with {ctx.show('parallel.tp')}; "
                "set parallel.sequence_parallel=false or tp > 1"
            ),
        )


def sharding_has_data_parallel(sharded: Any, dense_dp: Any, expert_dp: Any) -> Any:
    """Megatron's distributed optimizer and ZeRO partition over the data-parallel ranks (dense
    parameters over dp x cp, experts over their own dp, 1 for a dense model): with a group of one
    rank each there is nothing to partition, and the layout is the unsharded one (ZeRO-3 then only
    adds its gather buffers)."""
    return (sharded == 0) | (dense_dp > 1) | (expert_dp > 1)


def sharding_needs_data_parallel(ctx: TrainingContext) -> Iterator[Problem]:
    p, dims = ctx.spec.parallel, ParallelDims.from_spec(ctx.spec)
    if dims is None:  # world_size_matches reports the layout
        return
    backend = backend_of(ctx.spec)
    key = backend.sharding_key
    sharded = p.zero_stage > 0 if backend.zero_sharding else p.distributed_optimizer
    expert_dp = dims.expert_dp if ctx.spec.model.moe is not None else 1
    if not sharding_has_data_parallel(sharded, dims.dense_dp, expert_dp):
        off = "parallel.zero_stage=0" if backend.zero_sharding else "parallel.distributed_optimizer=false"
        yield warning(
            key,
            (
                f"{ctx.show(key)} has no effect: every data-parallel group is one rank (dp x cp = 1"
                f"{', expert dp = 1' if ctx.spec.model.moe is not None else ''}), so there is nothing to shard; "
                f"set {off}, or give data parallelism GPUs (more hardware.nodes, or lower parallel.tp/pp)"
            ),
        )


RULES = (
    world_size_matches,
    heads_divide_by_tp,
    kv_heads_fit_tp,
    widths_divide_by_tp,
    layers_fit_pipeline,
    tp_inside_nvlink_domain,
    cp_divides_sequence,
    cp_needs_flash_attention,
    virtual_stages_fit,
    virtual_stages_have_layers,
    sequence_parallel_needs_tp,
    sharding_needs_data_parallel,
)
