"""Serving numbers per node role and an upper bound on decode throughput from memory bandwidth.

Decoding one token per running sequence reads, on every GPU, its share of the weights and each
sequence's KV cache; at best that runs at hardware.gpu.hbm_gb_per_s. Weights read per step: a
dense model's all; a MoE model's non-expert part plus, at batch 1, the top_k / num_experts share of
the local experts (one token's experts, spread evenly: the optimistic case), at full batch all local
experts. KV read: max_model_len tokens per sequence (full context, the worst case). Pipeline stages
run in turn for a token, so a step of pp stages takes pp stage times. Compute, communication and
scheduling are ignored: real throughput is lower. Per engine = one data-parallel rank (vLLM runs
each as its own engine); the whole deployment is serve.dp of them.
"""

from __future__ import annotations

from dataclasses import dataclass

from lmspec.compiler.models.serve_layout import ServeLayout
from lmspec.compiler.models.serve_memory import ServeMemory, weight_split
from lmspec.compiler.models.units import GB
from lmspec.compiler.spec.sections import ServingSpec


@dataclass(frozen=True, kw_only=True)
class DecodeBound:
    batch: int  # sequences decoded together
    weights_read_bytes: int  # per GPU per step
    kv_read_bytes: int  # per GPU per step, batch x max_model_len tokens
    tokens_per_s: float  # per data-parallel rank (one engine)
    deployment_tokens_per_s: float  # all serve.dp ranks


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
    batch1: DecodeBound
    full_batch: DecodeBound  # batch = min(serve.max_num_seqs, sequences of max_model_len that fit)
    roles: tuple[RoleNumbers, ...]


def _bound(spec: ServingSpec, memory: ServeMemory, batch: int, weights: float) -> DecodeBound:
    v = spec.serve
    kv = batch * v.max_model_len * memory.kv_cache_bytes_per_token
    stage_s = (weights + kv) / (spec.hardware.gpu.hbm_gb_per_s * GB)
    per_rank = batch / (v.pp * stage_s) if batch else 0.0
    return DecodeBound(
        batch=batch,
        weights_read_bytes=round(weights),
        kv_read_bytes=kv,
        tokens_per_s=round(per_rank, 1),
        deployment_tokens_per_s=round(per_rank * v.dp, 1),
    )


def serve_numbers(spec: ServingSpec, layout: ServeLayout, memory: ServeMemory) -> ServeNumbers:
    v, m = spec.serve, spec.model
    split = weight_split(spec)
    active = split.experts * (m.moe.top_k / m.moe.num_experts) if m.moe else split.experts
    full = min(v.max_num_seqs, memory.max_concurrent_seqs)
    roles = []
    for role in layout.roles:
        engines = role.dp_ranks_per_node
        if layout.mode == "ray":  # Ray places every rank from node 0: its engines span the nodes
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
    return ServeNumbers(
        batch1=_bound(spec, memory, 1 if memory.max_concurrent_seqs else 0, split.dense + active),
        full_batch=_bound(spec, memory, full, split.dense + split.experts),
        roles=tuple(roles),
    )
