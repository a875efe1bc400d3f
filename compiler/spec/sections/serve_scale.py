"""The parts of `serve` that teams add when they run vLLM at scale: expert-parallel load balancing (EPLB),
multi-token-prediction speculative decoding and disaggregated prefill/decode pools.

Every name and bound is vLLM 0.32's own (vllm/config/parallel.py EPLBConfig, vllm/config/speculative.py,
vllm/config/kv_transfer.py and the KV connector factory), so serve/vllm.yaml carries them unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from lmspec.compiler.spec import kinds
from lmspec.compiler.spec.sections.declare import key

# vLLM 0.32's --all2all-backend choices that select a kernel (vllm/config/parallel.py All2AllBackend); left out:
# naive and pplx (removed: vLLM warns and falls back to allgather_reducescatter), flashinfer_all2allv (a
# temporary alias of flashinfer_nvlink_two_sided) and passthrough (bound by the MoE backend, not a CLI choice).
All2AllBackend = Literal[
    "allgather_reducescatter",
    "deepep_high_throughput",
    "deepep_low_latency",
    "deepep_v2",
    "mori_high_throughput",
    "mori_low_latency",
    "moonep",
    "nixl_ep",
    "flashinfer_nvlink_one_sided",
    "flashinfer_nvlink_two_sided",
]
# The connectors of vLLM 0.32's KV connector factory (vllm/distributed/kv_transfer/kv_connector/factory.py)
# that move a request's KV cache from a prefill engine to a decode engine, each driven by kv_role
# kv_producer / kv_consumer. The factory's others cache or offload KV for one engine (OffloadingConnector,
# SimpleCPUOffloadConnector, HiSparseConnector, MooncakeStoreConnector, ...) or are examples.
KvConnector = Literal[
    "NixlConnector",
    "NixlPullConnector",
    "NixlPushConnector",
    "MooncakeConnector",
    "MoRIIOConnector",
    "LMCacheConnectorV1",
]
SPECULATIVE_TOKENS_MAX = 64  # drafts per step; MTP models carry one to a few modules


@dataclass(frozen=True, kw_only=True)
class EplbSpec:
    """vLLM's expert-parallel load balancer (--enable-eplb, --eplb-config): it records each expert's load
    and periodically moves experts, with redundant copies of the hottest, so no rank waits on another."""

    num_redundant_experts: int = key(
        "Extra expert copies spread over the expert-parallel ranks (EPLBConfig.num_redundant_experts); "
        "the experts plus these must divide evenly over the ranks.",
        example=32,
        minimum=0,
        maximum=kinds.EXPERTS_MAX,
    )
    window_size: int = key(
        "Steps of expert load the balancer averages (EPLBConfig.window_size).",
        example=1000,
        minimum=1,
        maximum=kinds.STEPS_MAX,
    )
    step_interval: int = key(
        "Steps between two rearrangements of the experts (EPLBConfig.step_interval).",
        example=3000,
        minimum=1,
        maximum=kinds.STEPS_MAX,
    )


@dataclass(frozen=True, kw_only=True)
class SpeculativeSpec:
    """Speculative decoding with the model's own multi-token-prediction modules (vLLM --speculative-config
    method mtp): each step drafts num_tokens tokens and verifies them in one forward pass."""

    method: Literal["mtp"] = key("Draft source: mtp = the model's MTP modules (model.mtp_layers).", example="mtp")
    num_tokens: int = key(
        "Tokens drafted per step (vLLM's num_speculative_tokens).",
        example=1,
        minimum=1,
        maximum=SPECULATIVE_TOKENS_MAX,
    )
    acceptance_rate: float = key(
        "Expected share of drafted tokens the model accepts, in [0, 1]: lmspec's own input to its serving "
        "performance model (tokens per step), never passed to vLLM; measure it with vLLM's spec-decode metrics.",
        example=0.8,
        minimum=0,
        maximum=1,
    )


@dataclass(frozen=True, kw_only=True)
class PoolSpec:
    """One pool of a disaggregated deployment: `engines` copies of one vLLM engine of tp x dp GPUs on a node."""

    tp: int = key("The pool engine's --tensor-parallel-size.", example=8, minimum=1, maximum=kinds.RANKS_MAX)
    dp: int = key("The pool engine's --data-parallel-size.", example=1, minimum=1, maximum=kinds.RANKS_MAX)
    engines: int = key(
        "Copies of this pool's engine, each on a node of its own.", example=1, minimum=1, maximum=kinds.NODES_MAX
    )


@dataclass(frozen=True, kw_only=True)
class DisaggregationSpec:
    """Prefill and decode on separate engines, the KV cache of each request moved between them by vLLM's
    KV connector (--kv-transfer-config): prefill engines produce it, decode engines consume it."""

    kv_connector: KvConnector = key(
        "vLLM's KV connector between the pools: NixlConnector (NIXL over UCX/RDMA, vLLM's reference), "
        "NixlPull/PushConnector (NIXL reads or writes), MooncakeConnector, MoRIIOConnector (ROCm), "
        "LMCacheConnectorV1 (needs the lmcache package).",
        example="NixlConnector",
    )
    prefill: PoolSpec = key("The prefill pool (kv_role kv_producer).")
    decode: PoolSpec = key("The decode pool (kv_role kv_consumer).")
