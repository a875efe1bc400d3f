"""Which rule rejects which candidate: the validator's predicates, evaluated on arrays.

Each entry names a rule of `lmspec.compiler.rules` and calls that rule's own condition (the
plain-arithmetic predicates next to it, e.g. `layout.tp_divides_heads`) on candidate
columns (numpy arrays) and the spec's scalars, so the search drops exactly what
`lmspec check` would reject, and counts it under the same name. Entries are grouped
by the search stage that first knows every value they read, in the validator's rule
order (layout, experts, batch, backend), so a candidate is counted under the first
rule that rejects it. The last layout rules, the interleaved schedule's, read the
micro-batch count, so the micro-batch size is searched before the expert degree. The
expert all-to-all overlap (`parallel.overlap.moe_a2a`, searched for MoE models) is judged
with the backend, after the capability table, by the rules of rules/overlap.py and the two
of rules/moe_settings.py that read it, in the validator's order.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from lmspec.compiler.backends import BACKENDS as TRAINING_BACKENDS
from lmspec.compiler.backends import torchtitan
from lmspec.compiler.models import dims
from lmspec.compiler.models.dims import (
    ParallelDims,
    balanced_stages,
    derived_dp,
    expert_data_parallel_size,
    micro_batches_per_step,
    nodes_per_domain,
    ranks_per_stage,
    world_size,
)
from lmspec.compiler.models.stages import last_stage_extra
from lmspec.compiler.rules import batch, capability, experts, layout, moe_settings, overlap
from lmspec.compiler.spec.sections import TrainingSpec

BACKENDS: tuple[str, ...] = tuple(TRAINING_BACKENDS)  # a candidate's `backend` column indexes this
RECOMPUTE: tuple[Literal["none", "selective", "full"], ...] = ("none", "selective", "full")
ZERO_STAGES: tuple[Literal[0, 1, 2, 3], ...] = (0, 1, 2, 3)


class Columns(dict[str, np.ndarray]):
    """Candidate columns by spec-like name; `c.tp` reads `c["tp"]`."""

    def __getattr__(self, name: str) -> np.ndarray:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    @property
    def size(self) -> int:
        return len(next(iter(self.values()))) if self else 0

    def take(self, mask: np.ndarray) -> Columns:
        return Columns({k: v[mask] for k, v in self.items()})


Predicate = Callable[[Columns, TrainingSpec], Any]


@dataclass(frozen=True)
class Check:
    rule: str  # `module.function` in compiler/rules, or a search-only reason
    passes: Predicate  # True where the candidate is legal for this rule


def world(c: Columns, s: TrainingSpec) -> np.ndarray:
    return world_size(s.hardware.gpus_per_node, c.nodes)


def domain_gpus(c: Columns, s: TrainingSpec) -> np.ndarray:
    """GPUs of each candidate's job on one NVLink domain (models.dims.domain_gpus): the node count varies."""
    hw = s.hardware
    return dims.domain_gpus(hw.gpus_per_node, c.nodes, nodes_per_domain(hw.gpus_per_node, hw.nvlink_domain))


def data_parallel(c: Columns, s: TrainingSpec) -> np.ndarray:
    """dp = world / (tp x pp x cp), as `parallel.dp=auto` derives it (0 where it does not divide)."""
    return derived_dp(world(c, s), c.tp, c.pp, c.cp)


def dims_of(c: Columns, s: TrainingSpec) -> ParallelDims:
    """The degrees of candidates that carry dp and micro_batches (`evaluate.derive`), as arrays."""
    return ParallelDims(
        gpus_per_node=s.hardware.gpus_per_node,
        nodes=c.nodes,
        tp=c.tp,
        pp=c.pp,
        cp=c.cp,
        ep=c.ep,
        etp=s.parallel.etp,
        dp=c.dp,
        micro_batches=c.micro_batches,
        nodes_per_domain=nodes_per_domain(s.hardware.gpus_per_node, s.hardware.nvlink_domain),
    )


def backend_property(c: Columns, name: str) -> np.ndarray:
    """A TrainingBackend field of each candidate's backend (lmspec.compiler.backends), as a column."""
    return np.array([getattr(TRAINING_BACKENDS[b], name) for b in BACKENDS])[c.backend]


def _expert_group_fits(c: Columns, s: TrainingSpec) -> Any:
    if s.model.moe is None:  # the rule checks MoE models only
        return True
    return experts.expert_group_fits(ranks_per_stage(data_parallel(c, s), c.tp, c.cp), c.ep, s.parallel.etp)


# pp_layout is `auto` for every candidate: the stages are balanced, so pp need not divide the layers.
LAYOUT_CHECKS = (
    Check("layout.world_size_matches", lambda c, s: layout.world_divides(world(c, s), c.tp, c.pp, c.cp)),
    Check("layout.heads_divide_by_tp", lambda c, s: layout.tp_divides_heads(s.model.num_attention_heads, c.tp)),
    Check(
        "layout.kv_heads_fit_tp",
        lambda c, s: s.model.attention != "gqa" or layout.kv_heads_split_evenly(s.model.num_kv_heads, c.tp),
    ),
    Check(
        "layout.widths_divide_by_tp",
        lambda c, s: layout.tp_splits_widths(s.model.ffn_hidden_size, s.model.vocab_size, c.tp),
    ),
    Check("layout.layers_fit_pipeline", lambda c, s: layout.stages_have_layers(s.model.num_layers, c.pp)),
    Check("layout.tp_inside_nvlink_domain", lambda c, s: layout.tp_within_domain(c.tp, domain_gpus(c, s))),
    Check("layout.cp_divides_sequence", lambda c, s: layout.cp_splits_sequence(s.train.seq_length, c.cp)),
    Check("layout.cp_needs_flash_attention", lambda c, s: layout.cp_has_flash_attention(c.cp, s.train.flash_attention)),
)
EXPERT_CHECKS = (
    Check(
        "experts.ep_needs_moe",
        lambda c, s: experts.expert_parallel_has_moe(s.model.moe is not None, c.ep, s.parallel.etp),
    ),
    Check(
        "experts.experts_divide_by_ep",
        lambda c, s: s.model.moe is None or experts.ep_divides_experts(s.model.moe.num_experts, c.ep),
    ),
    Check("experts.expert_group_fits_ranks", _expert_group_fits),
)
BATCH_CHECKS = (
    Check(
        "batch.global_batch_divides",
        lambda c, s: batch.global_batch_splits(s.train.global_batch_size, c.micro_batch_size, data_parallel(c, s)),
    ),
)


def _virtual_stages_fit(c: Columns, s: TrainingSpec) -> Any:
    """`layout.virtual_stages_fit`: v > 1 needs a pipeline and micro-batches in groups of pp (the chunks
    need not split evenly: dims.chunk_layers)."""
    micro_batches = micro_batches_per_step(s.train.global_batch_size, c.micro_batch_size, data_parallel(c, s))
    interleaved = (c.pp > 1) & layout.interleaved_micro_batches_fit(micro_batches, c.pp)
    return (c.virtual_stages == 1) | interleaved


def _virtual_stages_have_layers(c: Columns, s: TrainingSpec) -> Any:
    """`layout.virtual_stages_have_layers` on balanced stages (a warning: chunks past the longest stage's layers
    are empty on every stage, the layout with fewer chunks again plus pipeline hops)."""
    longest = -(-s.model.num_layers // c.pp)
    return (c.virtual_stages == 1) | layout.some_stage_fills_its_chunks(longest, c.virtual_stages)


SCHEDULE_CHECKS = (Check("layout.virtual_stages_fit", _virtual_stages_fit),)


def candidate_impl(backend: str, spec: TrainingSpec) -> Literal["local", "transformer_engine"]:
    """The transformer_impl a candidate runs with: the spec's own where the backend has a target with it,
    else the pure-PyTorch one every backend has (DeepSpeed's trainer is transformers' PyTorch code)."""
    impls = {impl for impl, _ in TRAINING_BACKENDS[backend].targets}
    return spec.train.transformer_impl if spec.train.transformer_impl in impls else "local"


# The columns that decide which capabilities a candidate asks for, each reduced to the values that
# matter to `requested_features` (a degree > 1 or not), with how many such values it has.
_FEATURE_COLUMNS: tuple[tuple[str, Callable[[np.ndarray], np.ndarray], int], ...] = (
    ("backend", lambda v: v, len(BACKENDS)),
    ("tp", lambda v: v > 1, 2),
    ("pp", lambda v: v > 1, 2),
    ("virtual_stages", lambda v: v > 1, 2),
    ("cp", lambda v: v > 1, 2),
    ("ep", lambda v: v > 1, 2),
    ("sequence_parallel", lambda v: v, 2),
    ("recompute", lambda v: v, len(RECOMPUTE)),
    ("zero_stage", lambda v: v, len(ZERO_STAGES)),
    ("distributed_optimizer", lambda v: v, 2),
    ("moe_a2a", lambda v: v, 2),
)


def _candidate_spec(spec: TrainingSpec, values: tuple[int, ...]) -> TrainingSpec:
    """The spec with one combination of reduced feature columns written in (degrees > 1 as 2)."""
    backend, tp, pp, vp, cp, ep, sp, recompute, zero_stage, distributed_optimizer, moe_a2a = values
    parallel = dataclasses.replace(
        spec.parallel,
        tp=1 + tp,
        pp=1 + pp,
        cp=1 + cp,
        ep=1 + ep,
        virtual_stages=2 if vp else None,
        sequence_parallel=bool(sp),
        zero_stage=ZERO_STAGES[zero_stage],
        distributed_optimizer=bool(distributed_optimizer),
        offload_optimizer=False,
        offload_params=False,
        overlap=dataclasses.replace(spec.parallel.overlap, moe_a2a=bool(moe_a2a)),
    )
    train = dataclasses.replace(
        spec.train,
        backend=BACKENDS[backend],
        transformer_impl=candidate_impl(BACKENDS[backend], spec),
        recompute=RECOMPUTE[recompute],
    )
    return dataclasses.replace(spec, parallel=parallel, train=train)


def _target_runs(c: Columns, s: TrainingSpec) -> np.ndarray:
    """`capability.runs_spec` of each candidate: evaluated once per combination of the reduced feature
    columns present, then looked up by the combination's mixed-radix code. The digits of columns of one
    shape (a stage's survivors, or its new rows) are summed apart and broadcast together once."""
    radices = [radix for _, _, radix in _FEATURE_COLUMNS]
    weights = np.cumprod([1, *radices[:0:-1]])[::-1]  # each digit's place value
    parts: dict[tuple[int, ...], Any] = {}
    for (name, reduce_to, _), weight in zip(_FEATURE_COLUMNS, weights):
        digit = np.asarray(reduce_to(c[name]), dtype=np.int64) * weight
        parts[digit.shape] = parts.get(digit.shape, 0) + digit
    # every sum of one code per part: the codes present, or more (a combination absent is only evaluated)
    present = functools.reduce(lambda a, b: np.add.outer(a, b).ravel(), (np.unique(p) for p in parts.values()))
    table = np.zeros(int(np.prod(radices)), dtype=bool)
    for code in np.unique(present).tolist():
        digits = tuple(int(d) for d in np.unravel_index(code, radices))
        table[code] = capability.runs_spec(_candidate_spec(s, digits))
    return table[sum(parts.values())]


def _sharding_has_data_parallel(c: Columns, s: TrainingSpec) -> Any:
    dp = data_parallel(c, s)
    expert_dp = expert_data_parallel_size(world(c, s), c.ep, s.parallel.etp, c.pp) if s.model.moe is not None else 1
    sharded = c.distributed_optimizer | (c.zero_stage > 0)
    return layout.sharding_has_data_parallel(sharded, dp * c.cp, expert_dp)


def _moe_a2a_has_its_layout(c: Columns, s: TrainingSpec) -> Any:
    full = c.recompute == RECOMPUTE.index("full")
    half = s.train.precision != "fp32"
    return overlap.moe_a2a_has_its_layout(c.moe_a2a, c.ep, full, c.pp, c.virtual_stages, half, s.model.mtp_layers)


# The overlap's rules, in the validator's order (overlap, then moe_settings); the two of moe_settings are
# mirrored only where they read the overlap (the rest of them judge the job's MoE settings, whatever the layout).
OVERLAP_CHECKS = (
    Check("overlap.moe_a2a_needs_its_layout", _moe_a2a_has_its_layout),
    Check(
        "moe_settings.shared_expert_overlap_has_its_layout",
        lambda c, s: (s.model.moe is None) | moe_settings.overlaps_apart(c.moe_a2a, s.train.moe.shared_expert_overlap),
    ),
    Check(
        "moe_settings.a2a_overlap_has_an_all_to_all",
        lambda c, s: (
            (s.model.moe is None)
            | moe_settings.a2a_overlap_has_an_all_to_all_to_hide(c.moe_a2a, s.train.moe.dispatcher)
        ),
    ),
)


def _pipeline_stages_run(c: Columns, s: TrainingSpec) -> Any:
    """The torchtitan backend's `pipeline_rules` on balanced stages (TrainingBackend.pipeline_stage_modules): no
    tied embedding, at least pp micro-batches under 1F1B, and a decoder layer in every virtual stage."""
    modules = backend_property(c, "pipeline_stage_modules").astype(bool)
    micro_batches = micro_batches_per_step(s.train.global_batch_size, c.micro_batch_size, data_parallel(c, s))
    extra = last_stage_extra(s.model, s.train.seq_length)
    shortest = {int(pp): min(balanced_stages(s.model.num_layers, int(pp), extra)) for pp in np.unique(c.pp)}
    fills = torchtitan.stages_fill_their_chunks(
        np.vectorize(shortest.__getitem__, otypes=[np.int64])(c.pp), c.virtual_stages
    )
    scheduled = torchtitan.one_f_one_b_has_its_micro_batches(micro_batches, c.pp, c.virtual_stages)
    return (c.pp == 1) | ~modules | ((not s.model.tie_embeddings) & scheduled & fills)


BACKEND_CHECKS = (
    Check(
        "experts.moe_tensor_parallel_needs_sequence_parallel",
        lambda c, s: experts.moe_tp_has_sequence_parallel(
            backend_property(c, "moe_tp_needs_sequence_parallel"), s.model.moe is not None, c.tp, c.sequence_parallel
        ),
    ),
    Check("capability.target_runs_spec", _target_runs),
    *OVERLAP_CHECKS,
    Check("torchtitan.pipeline_rules", _pipeline_stages_run),  # the backends' own rules run after the overlap's
    # a warning, not an error: sequence parallel without TP changes nothing, so it is a duplicate
    Check("layout.sequence_parallel_needs_tp", lambda c, s: layout.sequence_parallel_has_tp(c.sequence_parallel, c.tp)),
    # also a warning: a sharding with one rank per data-parallel group is the unsharded layout again
    Check("layout.sharding_needs_data_parallel", _sharding_has_data_parallel),
    # and a warning: chunks past the longest stage's layers are empty on every stage
    Check("layout.virtual_stages_have_layers", _virtual_stages_have_layers),
)
