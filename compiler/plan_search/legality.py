"""Which rule rejects which candidate: the validator's predicates, evaluated on arrays.

Each entry names a rule of `compiler.rules` and gives its condition as plain
arithmetic over candidate columns (numpy arrays) and the spec's scalars, so the
search drops exactly what `lmspec check` would reject, and counts it under the
same name. Entries are grouped by the search stage that first knows every value
they read, in the validator's rule order (layout, experts, batch, backend), so a
candidate is counted under the first rule that rejects it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from compiler.sections import Spec

BACKENDS = ("megatron", "deepspeed")
RECOMPUTE = ("none", "selective", "full")


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
    return c.nodes * s.hardware.gpus_per_node


def data_parallel(c: Columns, s: Spec) -> np.ndarray:
    """dp = world / (tp x pp x cp), as `parallel.dp=auto` derives it (0 where it does not divide)."""
    mp = c.tp * c.pp * c.cp
    return np.where(world(c, s) % mp == 0, world(c, s) // mp, 0)


def _kv_heads_fit(c: Columns, s: Spec) -> Any:
    kv = s.model.num_kv_heads
    return (s.model.attention != "gqa") | (kv % c.tp == 0) | (c.tp % kv == 0)


def _expert_group_fits(c: Columns, s: Spec) -> Any:
    if s.model.moe is None:
        return True
    return (data_parallel(c, s) * c.tp * c.cp) % (c.ep * s.parallel.etp) == 0


def _is(c: Columns, backend: str) -> np.ndarray:
    return c.backend == BACKENDS.index(backend)


LAYOUT_CHECKS = (
    Check("layout.world_size_matches", lambda c, s: world(c, s) % (c.tp * c.pp * c.cp) == 0),
    Check("layout.heads_divide_by_tp", lambda c, s: s.model.num_attention_heads % c.tp == 0),
    Check("layout.kv_heads_fit_tp", _kv_heads_fit),
    Check("layout.layers_fit_pipeline", lambda c, s: c.pp <= s.model.num_layers),  # pp_layout=auto
    Check("layout.tp_inside_node", lambda c, s: c.tp <= s.hardware.gpus_per_node),
    Check("layout.cp_divides_sequence", lambda c, s: (c.cp == 1) | (s.train.seq_length % (2 * c.cp) == 0)),
)
EXPERT_CHECKS = (
    Check("experts.ep_needs_moe", lambda c, s: (s.model.moe is not None) | (c.ep == 1)),
    Check("experts.experts_divide_by_ep",
          lambda c, s: True if s.model.moe is None else s.model.moe.num_experts % c.ep == 0),
    Check("experts.expert_group_fits_ranks", _expert_group_fits),
)
BATCH_CHECKS = (
    Check("batch.global_batch_divides",
          lambda c, s: s.train.global_batch_size % (c.micro_batch_size * data_parallel(c, s)) == 0),
)
BACKEND_CHECKS = (
    Check("backend.zero_is_deepspeed", lambda c, s: ~(_is(c, "megatron") & (c.zero_stage > 0))),
    Check("backend.distributed_optimizer_is_megatron", lambda c, s: ~(_is(c, "deepspeed") & c.distributed_optimizer)),
    Check("backend.deepspeed_pipeline_needs_low_zero",
          lambda c, s: ~(_is(c, "deepspeed") & (c.pp > 1) & (c.zero_stage >= 2))),
    Check("backend.deepspeed_is_data_parallel",
          lambda c, s: ~(_is(c, "deepspeed") & ((c.tp > 1) | (c.cp > 1) | (c.ep > 1)))),
    # a warning, not an error: sequence parallel without TP changes nothing, so it is a duplicate
    Check("layout.sequence_parallel_needs_tp", lambda c, s: ~(c.sequence_parallel & (c.tp == 1))),
)
