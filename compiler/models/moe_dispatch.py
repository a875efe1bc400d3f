"""Bytes one GPU sends per MoE layer and micro-batch to move its tokens to their experts and back, per
token dispatcher, split into what stays on the node's NVLink and what crosses the NICs.

megatron-core's three dispatchers (train.moe.dispatcher; megatron/core/transformer/moe/token_dispatcher.py):

- `alltoall` (MoEAlltoAllTokenDispatcher): every routed copy of a token travels to its expert's rank, so a
  token sends top_k copies whether or not two of its experts share a rank or a node. Dispatch and combine
  forward, and their mirror images backward: four all-to-alls of top_k x hidden per token, (ep - 1) / ep
  of them leaving the GPU; the peers in the node are reached over NVLink, the rest over the NICs at once.
- `allgather` (MoEAllGatherTokenDispatcher): every rank gathers the tokens of the whole EP group and keeps
  those its experts take; combine reduce-scatters the outputs. Four ring collectives of ep x hidden per
  token: the volume grows with ep, not top_k (what makes it the small-EP choice).
- `flex` with DeepEP or HybridEP (MoEFlexTokenDispatcher): a token crosses the network once per
  destination node and is forwarded over NVLink to each destination GPU there, once per GPU (DeepEP's
  internode kernels), so cross-node bytes count distinct nodes, not copies. Group-limited routing
  (model.moe.router_num_groups / router_group_topk: DeepSeek-V3's node-limited routing when the groups
  are the EP group's nodes) bounds the nodes a token may reach.

With expert tensor parallelism (parallel.etp > 1) every dispatcher then gathers the received copies across
the ETP group and reduce-scatters the experts' outputs (`expert_tp_bytes`).

A token choosing k of n equally likely places reaches n (1 - (1 - 1/n)^k) distinct ones on average (with
replacement: an upper bound for distinct experts, exact enough for nodes and GPUs). FP8 dispatch is not
priced: megatron-core 0.16.1's flex dispatcher asserts it off (fused_a2a.py), so every dispatcher moves
the activations' dtype. Plain arithmetic on floats and numpy arrays.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lmspec.compiler.models import larger, pick, smaller

PASSES = 4  # dispatch and combine forward, their gradients backward


@dataclass(frozen=True)
class DispatchBytes:
    """Bytes one GPU sends per MoE layer and micro-batch (all four passes), inside the node and across."""

    intra: Any
    inter: Any


def distinct(places: Any, picks: int) -> Any:
    """Expected distinct places among `picks` uniform choices of `places` (places >= 1)."""
    n = larger(places, 1)
    return n * (1 - (1 - 1 / n) ** picks)


def dispatch_bytes(
    dispatcher: str,
    ep: Any,
    in_node: Any,
    tokens: Any,
    top_k: int,
    hidden: int,
    element_bytes: Any,
    route_groups: int = 0,
    route_group_topk: int = 0,
) -> DispatchBytes:
    """Bytes per MoE layer and micro-batch of one GPU's `tokens` (after any sequence-parallel split), with
    `in_node` of the `ep` expert-parallel ranks on its node."""
    token = tokens * hidden * element_bytes
    peers = larger(ep - 1, 1)
    if dispatcher == "allgather":  # a ring over the EP group: every other rank's tokens pass once
        total = PASSES * (ep - 1) * token
        crosses = ep > in_node
        return DispatchBytes(intra=pick(crosses, 0 * total, total), inter=pick(crosses, total, 0 * total))
    if dispatcher == "flex":
        nodes = larger(ep / larger(in_node, 1), 1)
        # group-limited routing: a token reaches at most group_topk groups' nodes
        per_group = larger(nodes / route_groups, 1) if route_groups else nodes
        reachable = smaller(nodes, route_group_topk * per_group) if route_groups else nodes
        remote_nodes = distinct(reachable, top_k) * (nodes - 1) / nodes
        gpus = distinct(smaller(reachable * in_node, ep), top_k)  # distinct destination GPUs
        forwarded = gpus * (in_node - 1) / larger(in_node, 1)  # NVLink legs inside the destination nodes
        return DispatchBytes(intra=PASSES * forwarded * token, inter=PASSES * remote_nodes * token)
    copies = PASSES * top_k * (ep - 1) / larger(ep, 1) * token  # alltoall: every copy travels
    local = (in_node - 1) / peers
    return DispatchBytes(intra=copies * local, inter=copies * (1 - local))


def expert_tp_bytes(etp: Any, received: Any) -> Any:
    """Bytes one GPU sends per MoE layer and micro-batch inside its expert-tensor-parallel group: an
    all-gather of the `received` bytes of routed copies before the experts and a reduce-scatter of their
    outputs, forward and backward ((etp - 1) x received each, 0 at etp = 1)."""
    return PASSES * (etp - 1) * received


def moe_a2a_overlaps(asked: Any, ep: Any, full_recompute: Any, pp: Any, virtual_stages: Any) -> Any:
    """Where parallel.overlap.moe_a2a hides a layout's all-to-alls: megatron-core's combined 1F1B needs expert
    parallelism, no full recompute and, on a pipeline, virtual stages (rules/overlap.py refuses the rest
    and asks the same of a layout). Plain arithmetic on floats or arrays; the step-time and memory models price
    the overlap only where this holds."""
    return (asked != 0) & (ep > 1) & (full_recompute == 0) & ((pp == 1) | (virtual_stages > 1))
