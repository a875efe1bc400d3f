"""Serving memory per GPU under vLLM: weights, KV cache per token, tokens and sequences that fit.

KV cache per token and layer (vLLM): GQA/MHA stores K and V, 2 x kv_heads x head_dim
elements, with kv heads replicated when tp > kv heads (each rank keeps at least one);
MLA stores the compressed latent plus the shared rotary key, (kv_lora_rank + rope dim)
elements, the same on every TP rank. vLLM hands the cache
gpu_memory_utilization x device memory, minus weights and the activation peak of its
profiling run; on CPU it takes VLLM_CPU_KVCACHE_SPACE (`serve.cpu_kvcache_space_gib`).
"""

from __future__ import annotations

from dataclasses import dataclass

from lmspec.compiler.models.dims import device_kind
from lmspec.compiler.models.params import count_params
from lmspec.compiler.models.serve_length import vllm_max_model_len
from lmspec.compiler.models.units import DTYPE_BYTES, FP32_BYTES, GIB
from lmspec.compiler.spec.sections import ModelSpec, ServingSpec

KV_FP8_BYTES = 1
# Bytes per weight of the linear layers under each quantization (4-bit packs two per byte).
QUANT_WEIGHT_BYTES = {"fp8": 1.0, "awq": 0.5, "gptq": 0.5, "bitsandbytes": 0.5}
BLOCK_TOKENS = 16  # vLLM's default KV block size: the cache is allocated in whole blocks
DEFAULT_BATCHED_TOKENS = 8192  # vLLM's default max_num_batched_tokens with chunked prefill
# Non-torch memory vLLM keeps outside its profile (CUDA graphs, NCCL, allocator slack).
SERVE_OVERHEAD_GIB = 1.0


@dataclass(frozen=True, kw_only=True)
class ServeMemory:
    weights_bytes_per_gpu: int
    kv_cache_bytes_per_token: int  # per GPU
    activation_reserve_bytes: int
    cache_budget_bytes: int  # what the KV cache gets on each GPU
    max_tokens_in_cache: int
    max_concurrent_seqs: int  # sequences of serve.max_model_len that fit at once
    max_model_len_that_fits: int  # longest single sequence the cache holds


def served_dtype(spec: ServingSpec) -> str:
    """serve.dtype; for auto, the dtype the model is stored in: convert.dtype for the conversion output,
    bfloat16 for a directory of serve.model_path (what released checkpoints hold)."""
    v = spec.serve
    if v.dtype != "auto":
        return v.dtype
    return spec.convert.dtype if v.model_path is None and spec.convert is not None else "bfloat16"


@dataclass(frozen=True, kw_only=True)
class WeightSplit:
    """Weights on one GPU: the routed experts (sharded by TP, or over TP x DP with expert parallel)
    apart from everything else (sharded by TP x PP)."""

    dense: float
    experts: float


def weight_split(spec: ServingSpec) -> WeightSplit:
    s, m = spec.serve, spec.model
    dtype = DTYPE_BYTES[served_dtype(spec)]
    counts = count_params(m)
    vocab = counts.embedding + counts.output_head
    linear = QUANT_WEIGHT_BYTES.get(s.quantization or "", dtype)
    experts = counts.expert * linear
    dense = (counts.total - counts.expert - vocab) * linear + vocab * dtype
    expert_shards = s.tp * s.dp if s.expert_parallel else s.tp
    return WeightSplit(dense=dense / (s.tp * s.pp), experts=experts / (expert_shards * s.pp))


def weight_bytes(spec: ServingSpec) -> int:
    split = weight_split(spec)
    return round(split.dense + split.experts)


def kv_bytes_per_token(spec: ServingSpec) -> int:
    s, m = spec.serve, spec.model
    dtype = DTYPE_BYTES[served_dtype(spec)]
    element = KV_FP8_BYTES if s.kv_cache_dtype.startswith("fp8") else dtype
    layers = -(-m.num_layers // s.pp)  # the fullest pipeline stage
    if m.attention == "mla":
        assert m.mla is not None
        return layers * (m.mla.kv_lora_rank + m.mla.qk_rope_head_dim) * element
    kv_heads = max(m.num_kv_heads // s.tp, 1)
    return layers * 2 * kv_heads * m.head_dim * element


def activation_reserve(spec: ServingSpec, m: ModelSpec) -> int:
    """Peak of vLLM's profiling forward: one chunk of batched tokens through the widest MLP,
    plus fp32 logits for every running sequence."""
    s = spec.serve
    dtype = DTYPE_BYTES[served_dtype(spec)]
    tokens = s.max_num_batched_tokens or max(DEFAULT_BATCHED_TOKENS, s.max_model_len)
    widest = max(m.ffn_hidden_size, (m.moe.ffn_hidden_size * m.moe.top_k) if m.moe else 0)
    per_token = (4 * m.hidden_size + 3 * widest / s.tp) * dtype
    logits = s.max_num_seqs * m.vocab_size / s.tp * FP32_BYTES
    return round(tokens * per_token + logits + SERVE_OVERHEAD_GIB * GIB)


def estimate_serve_memory(spec: ServingSpec) -> ServeMemory:
    s, hw = spec.serve, spec.hardware
    weights, per_token = weight_bytes(spec), kv_bytes_per_token(spec)
    reserve = activation_reserve(spec, spec.model)
    if device_kind(spec) == "cpu":  # vLLM's CPU backend: a fixed KV space, weights live in host RAM
        budget = round(s.cpu_kvcache_space_gib * GIB)
    else:
        budget = max(round(s.gpu_memory_utilization * hw.gpu.memory_gib * GIB) - weights - reserve, 0)
    tokens = budget // per_token // BLOCK_TOKENS * BLOCK_TOKENS
    return ServeMemory(
        weights_bytes_per_gpu=weights,
        kv_cache_bytes_per_token=per_token,
        activation_reserve_bytes=reserve,
        cache_budget_bytes=budget,
        max_tokens_in_cache=tokens,
        max_concurrent_seqs=tokens // s.max_model_len,
        max_model_len_that_fits=min(tokens, vllm_max_model_len(spec.model)),
    )
