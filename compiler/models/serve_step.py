"""How long one vLLM engine step takes on one GPU: compute, memory, communication and overhead.

A step of vLLM V1's scheduler runs one forward over every scheduled token: one token for each
decoding sequence plus a chunk of prompt tokens (chunked prefill, at most max_num_batched_tokens in
all). Each part of the forward takes the longer of its arithmetic and its memory traffic (a roofline
per part, not per step: at a mixed batch the attention of long contexts is bandwidth-bound while the
projections of a large chunk are compute-bound):

- linear layers: weights read once per step (a MoE layer only the experts some token picked:
  1 - (1 - top_k/E)^tokens of them), FLOPs 2 x active parameters per token at the weights' rate
  (FP8 weights on the GPU's FP8 rate; INT4 weights are dequantized to bf16; a quantize stage's checkpoint
  at its scheme's rate for the layers it quantized, the rest at bf16's: `linear_rates`);
- attention: each decoding sequence reads its KV cache (its context x bytes per token); a prefill
  chunk's queries attend over their prefix (FLOPs quadratic in the prompt);
- communication: two tensor-parallel all-reduces per layer of the step's tokens; with expert
  parallel over data-parallel ranks, the dispatch and combine all-to-alls of the top-k copies per
  MoE layer; each costs a
  latency plus bytes over NCCL's bus bandwidth (lmspec.compiler.models.steptime_inputs.bus_links);
- overhead: the scheduler, input preparation and sampler between forwards (a part per step, a part
  per running sequence, a part per prompt token, more for a step that carries a prompt), and, in
  eager mode, one kernel launch per operator per layer that CUDA graphs replay without the CPU.
  On a GPU with CUDA graphs the per-layer and per-token host terms are nil; vLLM's CPU backend runs
  eager and pays all of them (tests/serve/test_serve_cpu_timing.py measures them with probe models).

A pipeline of pp stages keeps pp micro-batches in flight (vLLM's virtual engines): each stage runs
1/pp of the step's tokens, a token passes every stage, so latency is pp stage times.
The efficiency constants are fitted on published serving runs (bench/serve_published.py,
serve_calibration.json); the CPU test measures its own.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from lmspec.compiler.models.dims import domain_gpus_of
from lmspec.compiler.models.flops import FLOPS_PER_MAC
from lmspec.compiler.models.params import count_params, is_moe_layer
from lmspec.compiler.models.serve_memory import ServeMemory, served_dtype, serves_quantize_output, weight_split
from lmspec.compiler.models.steptime_inputs import bus_links
from lmspec.compiler.models.units import DTYPE_BYTES, TFLOPS
from lmspec.compiler.quantize_modules import quantized_model
from lmspec.compiler.spec.sections import GpuSpec, ServingSpec

CALIBRATION_FILE = "serve_calibration.json"  # package data beside this module, written by the bench
TP_ALL_REDUCES_PER_LAYER = 2  # after attention's output projection and after the MLP
A2A_PER_MOE_LAYER = 2  # dispatch and combine
W4A16 = ("awq", "gptq", "bitsandbytes")  # 4-bit weights multiplied in bf16 after dequantizing
# INT8 tensor cores where the datasheet states no FP8 rate (Ampere): twice the bf16 rate (A100: 624 INT8
# TOPS, 312 bf16 TFLOP/s).
INT8_OVER_BF16 = 2


@dataclass(frozen=True, kw_only=True)
class ServeConstants:
    """What the hardware and vLLM reach of their peaks; fitted, each with the mechanism it stands for."""

    bandwidth_efficiency: float  # share of HBM bandwidth a decode step's weight and KV reads reach
    compute_efficiency: float  # share of the tensor-core peak a prefill GEMM reaches
    step_overhead_s: float  # scheduler, input preparation, sampler between forwards (CUDA graphs)
    seq_overhead_s: float  # the same host work that grows with each running sequence (block tables, sampling)
    launch_s: float  # one kernel launch and its Python dispatch in eager mode
    kernels_per_layer: float  # operators launched per decoder layer in eager mode
    collective_latency_s: float  # one NCCL / custom all-reduce or all-to-all, however small
    decode_attention_efficiency: float  # share of the bf16 peak decode attention's arithmetic reaches
    prefill_attention_efficiency: float  # the same for a prompt's causal attention
    seq_layer_s: float  # host work per decoding sequence per further layer (an eager per-sequence kernel)
    prefill_overhead_s: float  # a step that carries prompt tokens, beyond a decode step's host work
    prefill_layer_s: float  # the same per layer (its eager operators: more of them than a decode step's)
    token_overhead_s: float  # per prompt token a step carries (positions, slot mapping, admission)
    token_layer_s: float  # per prompt token per layer (the elementwise operators around the GEMMs)


@cache
def _calibration() -> dict[str, Any]:
    return dict(json.loads(resources.files(__package__).joinpath(CALIBRATION_FILE).read_text(encoding="utf-8")))


def gpu_constants() -> ServeConstants:
    """The GPU constants fitted to published runs (bench/serve_published.py --fit)."""
    return ServeConstants(**_calibration()["constants"])


def cpu_constants() -> ServeConstants:
    """vLLM's CPU backend on the machine bench/serve_cpu.py --write last measured, relative to the cpu
    hardware preset's rates: a scale for a CPU job, as the CPU preset itself is."""
    return ServeConstants(**_calibration()["cpu"]["constants"])


def constants_for(device: str) -> ServeConstants:
    """The constants of the device kind the spec runs on (lmspec.compiler.models.dims.device_kind)."""
    return cpu_constants() if device == "cpu" else gpu_constants()


@dataclass(frozen=True, kw_only=True)
class Batch:
    """What one engine step runs: decoding sequences with their mean context, and prompt tokens."""

    decode_seqs: float
    decode_context: float  # mean tokens in a decoding sequence's KV cache
    prefill_tokens: float
    prefill_context: float  # mean prefix a prefill token attends over (half the prompt, causal)
    verify_tokens: int = 1  # tokens each decoding sequence runs (1 + MTP drafts being verified)

    @property
    def tokens(self) -> float:
        return self.decode_seqs * self.verify_tokens + self.prefill_tokens


@dataclass(frozen=True, kw_only=True)
class StepTime:
    """One engine step (every pipeline stage), split by what the GPU spends it on."""

    linear_s: float
    attention_s: float
    communication_s: float
    overhead_s: float

    @property
    def total_s(self) -> float:
        return self.linear_s + self.attention_s + self.communication_s + self.overhead_s


@dataclass(frozen=True, kw_only=True)
class EngineShape:
    """What a step's cost depends on besides the batch, read once per spec (`engine_shape`)."""

    dense_bytes: float  # non-expert weights per GPU (one pipeline stage)
    expert_bytes: float  # routed-expert weights per GPU
    experts: int  # routed experts in the model (0 dense)
    top_k: int
    dense_flops_per_token: float  # per GPU, forward, non-expert linear layers
    expert_flops_per_token: float  # per GPU, forward, the top-k routed experts of one token
    linear_tflops: float  # the rate the non-expert linear layers run at
    expert_linear_tflops: float  # the rate the routed experts run at
    attention_tflops: float
    kv_bytes_per_token: float  # per GPU, the stage's layers
    attention_flops_per_token_context: float  # per GPU: 2 x 2 x heads x dims per layer per prefix token
    tp_bytes_per_token: float  # all-reduce payload per token per stage
    tp_bus_bytes_per_s: float
    tp_collectives: int  # per stage per step
    ep_bytes_per_token: float  # all-to-all payload per token per stage
    ep_bus_bytes_per_s: float
    ep_collectives: int
    ep_token_share: float  # tokens of the whole EP group routed through this GPU's step, per own token
    layers_per_stage: int
    pp: int
    hbm_bytes_per_s: float
    eager: bool


def engine_shape(spec: ServingSpec, memory: ServeMemory) -> EngineShape:
    v, m, hw = spec.serve, spec.model, spec.hardware
    split = weight_split(spec)
    counts = count_params(m)
    act_bytes = DTYPE_BYTES[served_dtype(spec)]
    layers = -(-m.num_layers // v.pp)
    moe_layers = sum(is_moe_layer(m, i) for i in range(m.num_layers)) / v.pp
    routed = counts.routed_experts
    per_expert = routed / m.moe.num_experts if m.moe else 0.0
    ep_group = v.tp * v.dp if (v.expert_parallel and m.moe) else v.tp
    # Tokens move between GPUs for the experts only across data-parallel ranks (each holds its own
    # requests); inside one rank every TP GPU already has the step's tokens, and the experts' partial
    # outputs are summed by the TP all-reduce that ends the layer anyway. Each TP GPU sends its 1/tp.
    a2a = bool(m.moe) and v.expert_parallel and v.dp > 1
    active_expert = per_expert * (m.moe.top_k if m.moe else 0)
    dense_params = counts.total - routed - counts.embedding  # the embedding is a lookup, not a GEMM
    linear_rate, expert_rate = linear_rates(spec)
    if m.attention == "mla":
        assert m.mla is not None
        # vLLM's MLA decode absorbs the up-projections: every head scores the latent (+ rope) and reads it back
        head_dims = m.mla.kv_lora_rank + m.mla.qk_rope_head_dim + m.mla.kv_lora_rank
    else:
        head_dims = 2 * m.head_dim
    attention_flops = FLOPS_PER_MAC * m.num_attention_heads * head_dims * layers / v.tp
    links = bus_links(hw)
    domain = domain_gpus_of(hw)  # a node, or the part of a rack's NVLink domain the engine's nodes fill
    tp_nodes = v.tp > domain
    ep_nodes = ep_group > domain
    return EngineShape(
        dense_bytes=split.dense,
        expert_bytes=split.experts,
        experts=m.moe.num_experts if m.moe else 0,
        top_k=m.moe.top_k if m.moe else 0,
        dense_flops_per_token=FLOPS_PER_MAC * dense_params / (v.tp * v.pp),
        expert_flops_per_token=FLOPS_PER_MAC * active_expert / (ep_group * v.pp),
        linear_tflops=linear_rate * TFLOPS,
        expert_linear_tflops=expert_rate * TFLOPS,
        attention_tflops=hw.gpu.bf16_tflops * TFLOPS,
        kv_bytes_per_token=memory.kv_cache_bytes_per_token,
        attention_flops_per_token_context=attention_flops,
        tp_bytes_per_token=TP_ALL_REDUCES_PER_LAYER * layers * 2 * (v.tp - 1) / v.tp * m.hidden_size * act_bytes,
        tp_bus_bytes_per_s=links.inter_bytes_per_s if tp_nodes else links.intra_for(v.tp),
        tp_collectives=TP_ALL_REDUCES_PER_LAYER * layers if v.tp > 1 else 0,
        ep_bytes_per_token=A2A_PER_MOE_LAYER
        * moe_layers
        * (ep_group - 1)
        / ep_group
        * (m.moe.top_k if m.moe else 0)
        * m.hidden_size
        * act_bytes
        / v.tp
        if a2a
        else 0.0,
        ep_bus_bytes_per_s=links.inter_bytes_per_s if ep_nodes else links.intra_for(ep_group),
        ep_collectives=round(A2A_PER_MOE_LAYER * moe_layers) if a2a else 0,
        ep_token_share=float(v.dp if (v.expert_parallel and m.moe) else 1),
        layers_per_stage=layers,
        pp=v.pp,
        hbm_bytes_per_s=hw.gpu.hbm_gb_per_s * 1e9,
        eager=v.enforce_eager,
    )


def quantized_tflops(scheme: str, gpu: GpuSpec) -> float:
    """The rate the GEMMs of a layer quantized by `scheme` (quantize.scheme) run at on `gpu`.

    fp8 and fp8_dynamic (W8A8) on the FP8 tensor cores; without them (Ampere) vLLM runs the checkpoint as
    weight-only FP8 (CompressedTensorsW8A16Fp8, Marlin) at the bf16 rate. int8 (W8A8) on the INT8 tensor
    cores: the FP8 rate where the datasheet states one (Hopper's INT8 TOPS are its FP8 TFLOP/s, 1,979 on an
    H100; Ada's INT8 TOPS are at least its FP8 rate), else INT8_OVER_BF16 x bf16 (Ampere). w4a16 dequantizes
    to bf16 and multiplies there. A CPU runs each at the rate its preset states (its int8 and fp8 GEMMs
    are not measured)."""
    if gpu.generation == "cpu" or scheme == "w4a16":
        return gpu.bf16_tflops
    if scheme == "int8":
        return gpu.fp8_tflops or INT8_OVER_BF16 * gpu.bf16_tflops
    return gpu.fp8_tflops or gpu.bf16_tflops


def _mixed(slow: float, fast: float, fast_share: float) -> float:
    """The rate of FLOPs a share of which runs at `fast`, the rest at `slow` (times add, not rates)."""
    if fast == slow:
        return slow
    return 1.0 / (fast_share / fast + (1.0 - fast_share) / slow)


def linear_rates(spec: ServingSpec) -> tuple[float, float]:
    """TFLOP/s of the non-expert linear layers and of the routed experts. A quantize stage's checkpoint runs
    the layers it quantized at quantized_tflops and those it kept (the output head, the routers, quantize.keep)
    at bf16's, each part by its share of the FLOPs (lmspec.compiler.quantize_modules); serve.quantization=fp8
    runs every linear layer at the FP8 rate where the GPU has one."""
    v, m, gpu = spec.serve, spec.model, spec.hardware.gpu
    if serves_quantize_output(spec):
        assert spec.quantize is not None
        q = quantized_model(spec, DTYPE_BYTES[served_dtype(spec)])
        fast = quantized_tflops(spec.quantize.scheme, gpu)
        counts = count_params(m)
        dense_params = counts.total - counts.routed_experts - counts.embedding
        quantized = q.attention.quantized_params + q.mla_down.quantized_params + q.dense_mlp.quantized_params
        dense = _mixed(gpu.bf16_tflops, fast, quantized / dense_params)
        return dense, _mixed(gpu.bf16_tflops, fast, q.experts.quantized_share)
    rate = gpu.fp8_tflops if (v.quantization == "fp8" and gpu.fp8_tflops) else gpu.bf16_tflops
    return rate, rate


def experts_touched(shape: EngineShape, tokens: float) -> float:
    """Share of the local experts some token of the step picks, routing uniform: 1 - (1 - k/E)^tokens."""
    if not shape.experts:
        return 0.0
    return 1.0 - (1.0 - shape.top_k / shape.experts) ** max(tokens, 0.0)


def step_time(shape: EngineShape, batch: Batch, c: ServeConstants) -> StepTime:
    """One step of `batch` (the engine's tokens; with data-parallel experts every rank steps at once)."""
    stage_tokens = batch.tokens / shape.pp  # each stage holds one of pp micro-batches
    bw = shape.hbm_bytes_per_s * c.bandwidth_efficiency
    moe_tokens = stage_tokens * shape.ep_token_share
    weights = shape.dense_bytes + shape.expert_bytes * experts_touched(shape, moe_tokens)
    linear_compute = (
        stage_tokens * shape.dense_flops_per_token / shape.linear_tflops
        + moe_tokens * shape.expert_flops_per_token / shape.expert_linear_tflops
    )
    linear = max(weights / bw, linear_compute / c.compute_efficiency)
    decode_seqs = batch.decode_seqs / shape.pp
    prefill = batch.prefill_tokens / shape.pp
    kv_read = decode_seqs * batch.decode_context * shape.kv_bytes_per_token
    per_context = shape.attention_flops_per_token_context
    decode_flops = per_context * decode_seqs * batch.verify_tokens * batch.decode_context
    prefill_flops = per_context * prefill * batch.prefill_context
    attention = max(kv_read / bw, decode_flops / (shape.attention_tflops * c.decode_attention_efficiency))
    attention += prefill_flops / (shape.attention_tflops * c.prefill_attention_efficiency)
    comm = 0.0
    if shape.tp_collectives:
        comm += shape.tp_collectives * c.collective_latency_s
        comm += stage_tokens * shape.tp_bytes_per_token / shape.tp_bus_bytes_per_s
    if shape.ep_collectives:
        comm += shape.ep_collectives * c.collective_latency_s
        comm += stage_tokens * shape.ep_bytes_per_token / shape.ep_bus_bytes_per_s
    launches = c.launch_s * c.kernels_per_layer * shape.layers_per_stage if shape.eager else 0.0
    layers = shape.layers_per_stage * shape.pp
    host = c.seq_overhead_s * batch.decode_seqs + c.seq_layer_s * batch.decode_seqs * (layers - 1)
    if batch.prefill_tokens:
        host += shape.pp * (c.prefill_overhead_s + c.prefill_layer_s * shape.layers_per_stage)
        host += batch.prefill_tokens * (c.token_overhead_s + c.token_layer_s * layers)
    # a token crosses every stage: latency is pp stage times (the overhead is paid once per step)
    return StepTime(
        linear_s=shape.pp * linear,
        attention_s=shape.pp * attention,
        communication_s=shape.pp * comm,
        # vLLM schedules each of the pp micro-batches as a step of its own: pp times the per-step host
        # work, the per-sequence work once for all of them; each stage boundary a send and a receive
        overhead_s=shape.pp * (c.step_overhead_s + launches) + host + (shape.pp - 1) * c.collective_latency_s,
    )
