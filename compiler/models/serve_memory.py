"""Serving memory per GPU under vLLM V1: weights, KV cache per token, tokens and sequences that fit.

KV cache per token and layer (vLLM): GQA/MHA stores K and V, 2 x kv_heads x head_dim
elements, with kv heads replicated when tp > kv heads (each rank keeps at least one);
MLA stores the compressed latent plus the shared rotary key, (kv_lora_rank + rope dim)
elements, the same on every TP rank.

What the cache gets follows `Worker.determine_available_memory` (vLLM 0.32): the worker takes a
memory snapshot after the CUDA context and NCCL communicators exist, requests
gpu_memory_utilization x the device total that mem_get_info reports, and subtracts everything
consumed since the snapshot (weights, memory outside torch, lazily connected NCCL peers), the
transient torch peak of one profiling forward of max_num_batched_tokens tokens plus the sampler
over max_num_seqs requests, and the CUDA-graph estimate (profiled into the budget by default,
VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1). What existed before the snapshot (CUDA context, NCCL
buffers) lives in the (1 - gpu_memory_utilization) margin and takes nothing from the cache. On CPU
the cache is VLLM_CPU_KVCACHE_SPACE (`serve.cpu_kvcache_space_gib`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lmspec.compiler.models.dims import device_kind
from lmspec.compiler.models.params import count_params
from lmspec.compiler.models.serve_defaults import (
    cudagraph_capture_sizes,
    max_num_batched_tokens,
    max_num_seqs,
    visible_memory_bytes,
)
from lmspec.compiler.models.serve_length import vllm_max_model_len
from lmspec.compiler.models.units import DTYPE_BYTES, FP32_BYTES, GIB
from lmspec.compiler.quantize_modules import COMPRESSED_TENSORS, quantized_model
from lmspec.compiler.spec.sections import ModelSpec, ServingSpec

KV_FP8_BYTES = 1
# Bytes per weight of the linear layers of a released checkpoint under each quantization (4-bit packs two
# per byte). compressed-tensors says its scheme in the checkpoint: the quantize stage's is the spec's
# (lmspec.compiler.quantize_modules prices it), a released one's is not known here and is priced at the dtype.
QUANT_WEIGHT_BYTES = {"fp8": 1.0, "awq": 0.5, "gptq": 0.5, "bitsandbytes": 0.5}
BLOCK_TOKENS = 16  # vLLM's default KV block size: the cache is allocated in whole blocks
# Live hidden-size vectors per token at a layer's peak: residual, normed input, the layer's output
# and the projection being written (vLLM keeps the residual apart from the fused add-norm).
HIDDEN_VECTORS_LIVE = 4
# fp32 vocab-wide buffers of the sampler warm-up at once (_dummy_sampler_run's second, native call):
# softmax probabilities, the exponential noise of random_sample, and their quotient before argmax.
SAMPLER_FP32_BUFFERS = 3
# Memory outside torch that appears during the profile run, after the snapshot: the CUDA modules
# of the compiled and Triton kernels and the cuBLAS/cuBLASLt workspaces of the first GEMMs. An
# order-of-magnitude figure (uncalibrated: no allowed source publishes vLLM's non-torch increase).
NON_TORCH_GIB = 0.25
# NCCL send/recv peers of pipeline parallel connect lazily, at the first transfer of the profile run
# (the communicators themselves are built before the snapshot): NCCL_BUFFSIZE (4 MiB) per channel
# and protocol, to the previous and the next stage. Order-of-magnitude, uncalibrated.
NCCL_P2P_GIB = 0.25
# Driver memory of one captured graph per decoder layer it spans (kernel nodes and their launch
# parameters); vLLM measures it as the second capture of each mode. Uncalibrated estimate.
CUDAGRAPH_BYTES_PER_LAYER = 160 * 1024


@dataclass(frozen=True, kw_only=True)
class ServeMemory:
    weights_bytes_per_gpu: int
    kv_cache_bytes_per_token: int  # per GPU
    activation_reserve_bytes: int  # everything but weights taken from the request: the four terms below
    cache_budget_bytes: int  # what the KV cache gets on each GPU
    max_tokens_in_cache: int
    max_concurrent_seqs: int  # sequences of serve.max_model_len that fit at once
    max_model_len_that_fits: int  # longest single sequence the cache holds
    requested_bytes: int  # gpu_memory_utilization x the device total vLLM sees (0 on CPU)
    activation_peak_bytes: int  # transient torch peak of the profile run (forward or sampler)
    cudagraph_bytes: int  # vLLM's CUDA-graph estimate, taken from the cache
    non_torch_bytes: int  # memory outside torch that appears during the profile run
    nccl_bytes: int  # NCCL buffers connected after the snapshot (pipeline send/recv)


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
    apart from everything else (sharded by TP x PP, but for what vLLM replicates: replicated_params)."""

    dense: float
    experts: float


def replicated_params(m: ModelSpec) -> tuple[int, int]:
    """(linear, unquantized) parameters vLLM keeps whole on every tensor-parallel rank: MLA's down-projections
    (DeepSeek-V2/V3's fused_qkv_a_proj, built with disable_tp), and, unquantized, each MoE layer's router
    (ReplicatedLinear) and the norms."""
    counts = count_params(m)
    down = 0
    if m.attention == "mla":
        assert m.mla is not None
        q_down = m.mla.q_lora_rank or 0
        down = m.num_layers * m.hidden_size * (q_down + m.mla.kv_lora_rank + m.mla.qk_rope_head_dim)
    return down, counts.router + counts.norms


def serves_quantize_output(spec: ServingSpec) -> bool:
    """Whether vLLM serves the quantize stage's checkpoint (quantize set, serve.model_path null), whose
    layers lmspec.compiler.quantize_modules prices by the spec's scheme and keep patterns."""
    return spec.quantize is not None and spec.serve.model_path is None and spec.serve.quantization == COMPRESSED_TENSORS


def weight_split(spec: ServingSpec) -> WeightSplit:
    s, m = spec.serve, spec.model
    dtype = DTYPE_BYTES[served_dtype(spec)]
    counts = count_params(m)
    vocab = counts.embedding + counts.output_head
    down, whole = replicated_params(m)
    others = counts.total - counts.expert - vocab - down - whole  # attention and MLP, with their norms and biases
    if serves_quantize_output(spec):
        q = quantized_model(spec, dtype)
        experts = q.experts.bytes
        linear_params = q.attention.params + q.dense_mlp.params
        sharded = q.attention.bytes + q.dense_mlp.bytes + (others - linear_params + vocab) * dtype
        replicated = q.mla_down.bytes + whole * dtype
    else:
        linear = QUANT_WEIGHT_BYTES.get(s.quantization or "", dtype)
        experts = counts.expert * linear
        sharded = others * linear + vocab * dtype
        replicated = down * linear + whole * dtype
    expert_shards = s.tp * s.dp if s.expert_parallel else s.tp
    dense = sharded / (s.tp * s.pp) + replicated / s.pp
    return WeightSplit(dense=dense, experts=experts / (expert_shards * s.pp))


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


def _dense_layer_bytes_per_token(spec: ServingSpec, m: ModelSpec) -> float:
    """Torch peak per token inside a dense layer: the live hidden vectors plus the column-parallel
    gate/up output (2 x ffn / tp) and the activated half (ffn / tp); attention's q/k/v is narrower."""
    tp = spec.serve.tp
    attention = (m.num_attention_heads + 2 * m.num_kv_heads) * m.head_dim / tp
    return HIDDEN_VECTORS_LIVE * m.hidden_size + max(3 * m.ffn_hidden_size / tp, attention)


def _moe_layer_bytes_per_token(spec: ServingSpec, m: ModelSpec) -> float:
    """Torch peak per token inside an MoE layer: fused_moe's routed-token buffers (gate/up, activated
    and down outputs for each of top_k slots, the grouped GEMM's workspaces) plus router logits.

    Without expert parallel each rank holds every expert's 1/tp slice; with it each rank holds whole
    experts, so the buffers are not divided by tp. (The allgather_reducescatter all2all also gathers
    the other dp ranks' tokens; how far vLLM chunks that gather is not modelled yet.)"""
    s = spec.serve
    assert m.moe is not None
    ffn = m.moe.ffn_hidden_size if s.expert_parallel else m.moe.ffn_hidden_size / s.tp
    routed = m.moe.top_k * (3 * ffn + m.hidden_size) + m.moe.num_experts
    return HIDDEN_VECTORS_LIVE * m.hidden_size + routed


def forward_peak_bytes(spec: ServingSpec) -> int:
    """Peak of `GPUModelRunner.profile_run`'s `_dummy_run(max_num_tokens)`: one forward of
    max_num_batched_tokens tokens, at the widest layer (dense MLP or MoE). Layers run one after
    another, so only one layer's intermediates are live; attention runs on the tokens themselves
    (no KV cache yet) with FlashAttention, whose workspace is per head, not per token pair."""
    m = spec.model
    tokens = max_num_batched_tokens(spec)
    per_token = _dense_layer_bytes_per_token(spec, m)
    if m.moe is not None:
        per_token = max(per_token, _moe_layer_bytes_per_token(spec, m))
    return round(tokens * per_token * DTYPE_BYTES[served_dtype(spec)])


def sampler_peak_bytes(spec: ServingSpec) -> int:
    """Peak of `_dummy_sampler_run` on the last pipeline stage: logits of min(max_num_seqs,
    max_num_batched_tokens) requests over the whole vocabulary (gathered across TP) in the model
    dtype, their fp32 copy (Sampler.forward), and the native top-k/top-p path's fp32 buffers; the
    forward's hidden states are still held."""
    m = spec.model
    dtype = DTYPE_BYTES[served_dtype(spec)]
    tokens = max_num_batched_tokens(spec)
    rows = min(max_num_seqs(spec), tokens)
    fp32_copy = FP32_BYTES if dtype != FP32_BYTES else 0
    per_logit = dtype + fp32_copy + SAMPLER_FP32_BUFFERS * FP32_BYTES
    return round(rows * m.vocab_size * per_logit + tokens * m.hidden_size * dtype)


def activation_peak_bytes(spec: ServingSpec) -> int:
    """vLLM's transient_peak_headroom: torch's allocated peak during profile_run less what stays
    allocated after it; the forward and the sampler run one after the other."""
    return max(forward_peak_bytes(spec), sampler_peak_bytes(spec))


def cudagraph_bytes(spec: ServingSpec) -> int:
    """`GPUModelRunner.profile_cudagraph_memory`: per mode, the first capture (the largest size, whose
    graph pool holds that batch's intermediates) plus the second capture's cost for every further
    graph; FULL and PIECEWISE share the pool, so the larger first capture counts once. The default
    FULL_AND_PIECEWISE mode captures piecewise graphs for every size and full graphs for the decode
    sizes up to max_num_seqs."""
    sizes = cudagraph_capture_sizes(spec)
    if not sizes:
        return 0
    m, s = spec.model, spec.serve
    layers = -(-m.num_layers // s.pp)
    full = [n for n in sizes if n <= max_num_seqs(spec)]
    per_graph = layers * CUDAGRAPH_BYTES_PER_LAYER
    tokens = max_num_batched_tokens(spec)
    pool = forward_peak_bytes(spec) * max(sizes) // tokens
    return pool + per_graph * (len(sizes) - 1 + max(len(full) - 1, 0))


def nccl_bytes(spec: ServingSpec) -> int:
    """NCCL buffers vLLM counts against the cache: only pipeline send/recv peers, connected at the
    profile run's first transfer. TP/DP/EP communicators (and the custom all-reduce buffers) are
    set up and warmed before the snapshot, so they sit in the utilization margin."""
    return round(NCCL_P2P_GIB * GIB) if spec.serve.pp > 1 else 0


def tokens_in_cache(budget: int, per_token: int) -> int:
    """Tokens the cache holds: vLLM allocates whole blocks of BLOCK_TOKENS tokens from the budget."""
    return budget // per_token // BLOCK_TOKENS * BLOCK_TOKENS


def estimate_serve_memory(spec: ServingSpec) -> ServeMemory:
    s = spec.serve
    weights, per_token = weight_bytes(spec), kv_bytes_per_token(spec)
    if device_kind(spec) == "cpu":  # vLLM's CPU backend: a fixed KV space, weights live in host RAM
        requested = peak = graphs = non_torch = nccl = 0
        budget = round(s.cpu_kvcache_space_gib * GIB)
    else:
        requested = math.ceil(visible_memory_bytes(spec.hardware) * s.gpu_memory_utilization)
        peak, graphs, nccl = activation_peak_bytes(spec), cudagraph_bytes(spec), nccl_bytes(spec)
        non_torch = round(NON_TORCH_GIB * GIB)
        budget = max(requested - weights - peak - graphs - non_torch - nccl, 0)
    tokens = tokens_in_cache(budget, per_token)
    return ServeMemory(
        weights_bytes_per_gpu=weights,
        kv_cache_bytes_per_token=per_token,
        activation_reserve_bytes=peak + graphs + non_torch + nccl,
        cache_budget_bytes=budget,
        max_tokens_in_cache=tokens,
        max_concurrent_seqs=tokens // s.max_model_len,
        max_model_len_that_fits=min(tokens, vllm_max_model_len(spec.model)),
        requested_bytes=requested,
        activation_peak_bytes=peak,
        cudagraph_bytes=graphs,
        non_torch_bytes=non_torch,
        nccl_bytes=nccl,
    )
