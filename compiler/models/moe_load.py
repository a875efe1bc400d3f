"""How unevenly routed tokens land on expert-parallel ranks: the max over the mean of the token copies one
EP rank receives per MoE layer and micro-batch.

The slowest EP rank sets the pace of every MoE layer (the combine all-to-all waits for it) and holds the
most routed activations, so the step-time model (steptime_compute.py, steptime_comm.py) and the memory
model price the worst rank at `imbalance` times the mean. One owner, from the routing settings:

- `train.moe.force_balance` (megatron-core's moe_router_force_load_balancing: tokens routed uniformly, the
  benchmark mode of the published Megatron-Bridge runs): 1.
- `train.moe.load_imbalance`: a measured max/mean, stated by the user, taken as is.
- otherwise the sampling spread of a balanced router: each of the `ep` ranks receives the top-k copies of
  the EP group's tokens with probability 1/ep each, a binomial count of mean mu = tokens x top_k and
  variance mu (1 - 1/ep); the largest of ep such counts lies about sqrt(2 ln ep) standard deviations above
  the mean (the Gaussian extreme), so imbalance = 1 + sqrt(2 ln ep) sqrt((1 - 1/ep) / mu). A trained
  router's own preference for some experts is not in this figure: it is what train.moe.load_imbalance
  states (megatron-core logs tokens per expert with --moe-per-layer-logging).
- a capacity factor drops the copies above capacity: no rank holds more than capacity_factor x the mean,
  and with `pad_to_capacity` every rank holds exactly that.

Plain arithmetic on floats and numpy arrays (`rank_imbalance`), so `lmspec plan` prices a million layouts
with the formula that prices one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from lmspec.compiler.models import larger, pick, smaller
from lmspec.compiler.spec.sections import TrainingSpec


def _log(x: Any) -> Any:
    """Natural log of a number, or of a numpy array (numpy is imported only where `lmspec plan` passes one)."""
    if isinstance(x, int | float):
        return math.log(x)
    import numpy as np

    return np.log(x)


def sampling_imbalance(ep: Any, copies_per_rank: Any) -> Any:
    """Expected max/mean copies over `ep` ranks when a balanced router scatters `copies_per_rank` x ep
    copies uniformly: 1 + sqrt(2 ln ep) sqrt((1 - 1/ep) / mean), 1 at ep = 1."""
    spread = (2 * _log(larger(ep, 1)) * (1 - 1 / ep) / larger(copies_per_rank, 1)) ** 0.5
    return 1 + spread


@dataclass(frozen=True)
class Routing:
    """The train.moe settings that decide how evenly copies land (`of`), one value the step-time and memory
    models both read."""

    force_balance: bool = False
    stated: float | None = None  # train.moe.load_imbalance
    capacity_factor: float | None = None
    pad_to_capacity: bool = False

    @staticmethod
    def of(spec: TrainingSpec) -> Routing:
        m = spec.train.moe
        return Routing(m.force_balance, m.load_imbalance, m.capacity_factor, m.pad_to_capacity)


def rank_imbalance(ep: Any, tokens: Any, top_k: int, routing: Routing = Routing()) -> Any:
    """Max/mean routed copies per EP rank (see the module docstring); `tokens` are one rank's tokens of a
    micro-batch as the dispatcher sees them (micro-batch x sequence / cp)."""
    if routing.stated is not None:
        estimate: Any = routing.stated + 0 * ep
    else:
        estimate = pick(routing.force_balance, 1.0, sampling_imbalance(ep, tokens * top_k))
    if routing.capacity_factor is not None:
        cap = routing.capacity_factor
        estimate = cap + 0 * ep if routing.pad_to_capacity else smaller(estimate, cap)
    return pick(ep > 1, estimate, 1.0)
