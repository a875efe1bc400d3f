"""Serving numbers per node role: the GPUs, engines and cache each kind of node holds.

How fast the deployment serves is compiler/models/serve_perf.py's (the one owner of TTFT, TPOT and
throughput); this module only counts what sits on each node.
"""

from __future__ import annotations

from dataclasses import dataclass

from lmspec.compiler.models.serve_layout import ServeLayout
from lmspec.compiler.models.serve_memory import ServeMemory
from lmspec.compiler.spec.sections import ServingSpec


@dataclass(frozen=True, kw_only=True)
class RoleNumbers:
    """What one node of a role holds: its GPUs, its data-parallel ranks and their cache."""

    role: str
    nodes: tuple[int, ...]
    gpus_per_node: int
    dp_ranks_per_node: int  # engines started on each node (ray: all on node 0, their GPUs span the nodes)
    tokens_in_cache_per_node: int  # summed over the node's engines
    concurrent_seqs_per_node: int  # sequences of max_model_len on the node's engines


@dataclass(frozen=True, kw_only=True)
class ServeNumbers:
    roles: tuple[RoleNumbers, ...]


def serve_numbers(spec: ServingSpec, layout: ServeLayout, memory: ServeMemory) -> ServeNumbers:
    v = spec.serve
    roles = []
    for role in layout.roles:
        engines = role.dp_ranks_per_node
        if layout.spans_nodes:  # mp, ray: every engine's scheduler is on node 0, its ranks span the nodes
            engines = v.dp if role.name == "head" else 0
        roles.append(
            RoleNumbers(
                role=role.name,
                nodes=role.nodes,
                gpus_per_node=role.gpus_per_node,
                dp_ranks_per_node=engines,
                tokens_in_cache_per_node=engines * memory.max_tokens_in_cache,
                concurrent_seqs_per_node=engines * memory.max_concurrent_seqs,
            )
        )
    return ServeNumbers(roles=tuple(roles))
