"""Which rule rejects which candidate: the validator's predicates, evaluated on arrays.

Each entry names a rule of `lmspec.compiler.rules` and calls that rule's own condition (the
plain-arithmetic predicates next to it, e.g. `layout.tp_divides_heads`) on candidate
columns (numpy arrays) and the spec's scalars, so the search drops exactly what
`lmspec check` would reject, and counts it under the same name. Entries are grouped
by the search stage that first knows every value they read, in the validator's rule
order (layout, experts, batch, backend), so a candidate is counted under the first
rule that rejects it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from lmspec.compiler.models.dims import ParallelDims, derived_dp, ranks_per_stage, world_size
from lmspec.compiler.rules import backend, batch, experts, layout
from lmspec.compiler.spec.sections import Spec

BACKENDS: tuple[Literal["megatron", "deepspeed"], ...] = ("megatron", "deepspeed")
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


Predicate = Callable[[Columns, Spec], Any]


@dataclass(frozen=True)
class Check:
    rule: str  # `module.function` in compiler/rules, or a search-only reason
    passes: Predicate  # True where the candidate is legal for this rule


def world(c: Columns, s: Spec) -> np.ndarray:
    return world_size(s.hardware.gpus_per_node, c.nodes)


def data_parallel(c: Columns, s: Spec) -> np.ndarray:
    """dp = world / (tp x pp x cp), as `parallel.dp=auto` derives it (0 where it does not divide)."""
    return derived_dp(world(c, s), c.tp, c.pp, c.cp)


def dims_of(c: Columns, s: Spec) -> ParallelDims:
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
    )


def _deepspeed(c: Columns) -> np.ndarray:
    return c.backend == BACKENDS.index("deepspeed")


def _expert_group_fits(c: Columns, s: Spec) -> Any:
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
    Check("layout.tp_inside_node", lambda c, s: layout.tp_within_node(c.tp, s.hardware.gpus_per_node)),
    Check("layout.cp_divides_sequence", lambda c, s: layout.cp_splits_sequence(s.train.seq_length, c.cp)),
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
BACKEND_CHECKS = (
    Check("backend.zero_is_deepspeed", lambda c, s: backend.zero_matches_backend(_deepspeed(c), c.zero_stage)),
    Check(
        "backend.distributed_optimizer_is_megatron",
        lambda c, s: backend.distributed_optimizer_matches_backend(_deepspeed(c), c.distributed_optimizer),
    ),
    Check(
        "backend.deepspeed_pipeline_needs_low_zero",
        lambda c, s: backend.pipeline_zero_supported(_deepspeed(c), c.pp, c.zero_stage),
    ),
    Check(
        "backend.deepspeed_is_data_parallel", lambda c, s: backend.data_parallel_only(_deepspeed(c), c.tp, c.cp, c.ep)
    ),
    Check(
        "experts.moe_tensor_parallel_needs_sequence_parallel",
        lambda c, s: experts.moe_tp_has_sequence_parallel(
            ~_deepspeed(c), s.model.moe is not None, c.tp, c.sequence_parallel
        ),
    ),
    # a warning, not an error: sequence parallel without TP changes nothing, so it is a duplicate
    Check("layout.sequence_parallel_needs_tp", lambda c, s: layout.sequence_parallel_has_tp(c.sequence_parallel, c.tp)),
)
