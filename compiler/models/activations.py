"""Activation memory saved for backward, per layer and per micro-batch.

Two accountings, one per kind of model code the backends train:

- `megatron`: Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
  Transformer Models", section 4 and Table 2), tensor by tensor, generalised from GPT
  (LayerNorm, GeLU 4h MLP, dropout, MHA) to GQA/MLA, SwiGLU and MoE top-k. For GPT it
  gives sbh(34 + 5as/h) and its TP / TP+SP / selective / full forms exactly. SwiGLU is
  megatron's fused `bias_swiglu` (it saves its input only; the runtime sets
  `bias_activation_fusion`). `kernels` says which norms and rotary embedding run:
  - "fused" (Transformer Engine): a norm saves its input (the next linear its output), the
    rotary embedding its frequencies only;
  - "torch" (megatron-core's local path, measured on the runtime's own layers in tests/models):
    torch's RMSNorm also saves its fp32 normalised input and rsqrt; the unfused rotary
    embedding saves cos and sin of the query and of the key rotation (s x rope dim, fp32, once
    per layer and sequence); the value is a view of the fused QKV projection's output, which
    therefore stays whole unless the unfused attention repeats K and V to every query head.
  MoE as megatron-core's router and experts save it: router logits, probabilities and routing
  map over all experts, top-k indices and scores and their normalising sum; per routed copy this
  GPU's experts receive (top_k x `routed_load`: the worst EP rank's imbalance, a capacity factor's
  cap or padding) the permuted input, the expert's fc1 output and weighted-SwiGLU output and its
  probability; the permutation index per copy sent (alltoall, flex) or received (allgather).
  Under FP8 or FP4 (`quantized_input_bytes`), TE's linear layers save their input quantized, one layout
  for the weight-gradient GEMM (transformer_engine/pytorch/module/linear.py keeps the columnwise usage
  only): the norms' outputs (the QKV, fc1 and MLA up-projection inputs), SwiGLU's output (fc2's input)
  and the experts' permuted input become the recipe's bytes; the output projection keeps a quantized copy
  of the attention output beside the bf16 one attention saves. MLA's two down-projections are priced as
  one saved copy of the norm's output.
  Besides what it saves, a MoE layer holds its dispatcher's buffers while it runs
  (`moe_transient_bytes`, a working term like full recompute's rebuilt layer). Both measured per
  dispatcher (alltoall, allgather) at ep=2 on two gloo ranks, tests/models/test_measured_moe.py
  (saved within 1%, transient within ~3%); flex (DeepEP) is priced from megatron-core's source.
- `hf`: the HuggingFace modeling code the DeepSpeed backend trains, as measured on CPU
  with saved_tensors_hooks (tests/models): unfused RMSNorm (fp32 input, rsqrt, normalised
  and output tensors), eager attention with K/V repeated to every head, MoE experts that
  gather their tokens.

The s x s score matrix (the 5as/h term) is stored only without a flash/fused attention
kernel (`train.flash_attention=false`, megatron-core's local DotProductAttention, HF "eager")
and dropped by selective recompute; unfused attention repeats grouped K/V to every head.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal

from lmspec.compiler.models import ArrayOrNumber, larger, pick, smaller
from lmspec.compiler.models.units import FP32_BYTES
from lmspec.compiler.spec.sections import ModelSpec

Style = Literal["megatron", "hf"]
Kernels = Literal["fused", "torch"]
Dispatcher = Literal["alltoall", "allgather", "flex"]
INDEX_BYTES = 8  # int64 token ids / labels / expert indices
# torch's CPU generator state (mt19937): megatron's RNG tracker keeps three (default, expert and data-parallel
# seeds) and each checkpointed layer saves three with its input; host memory on a GPU, device memory on CPU
RNG_STATE_BYTES = 5056
RNG_STATES = 3
MASK_BYTES = 1  # dropout masks are stored as bytes


@dataclass(frozen=True, kw_only=True)
class LayerShape:
    """Widths of one transformer layer, per token, as activations see them."""

    hidden: int
    heads: int
    q_width: int  # heads x query/key head dim
    k_width: int  # key width as stored before attention (kv heads x head dim)
    v_width: int  # value width as stored (kv heads x value head dim)
    out_width: int  # heads x value head dim: input of the output projection
    q_latent: int = 0  # MLA query low rank (0 = none)
    kv_latent: int = 0  # MLA key/value low rank
    rope_width: int = 0  # MLA shared rotary key width
    rotary_dim: int = 0  # the rotated width of one query/key head
    ffn: int = 0  # dense MLP width, or shared experts' total width in a MoE layer
    expert_ffn: int = 0  # one routed expert's width
    top_k: int = 0
    experts: int = 0
    gated: bool = True  # SwiGLU (gate and up) vs GeLU
    dropout: bool = False  # GPT-style dropout after attention, MLP and softmax


@dataclass(frozen=True, kw_only=True)
class ActivationSetting:
    """What, besides the shape, decides activation bytes. tp, cp and micro_batch_size are arrays
    when compiler/search prices a grid of them at once."""

    style: Style
    seq_length: int
    micro_batch_size: ArrayOrNumber
    element_bytes: int  # 2 for bf16/fp16, 4 for fp32
    tp: ArrayOrNumber = 1
    cp: ArrayOrNumber = 1
    etp: int = 1
    sequence_parallel: bool = False
    recompute: Literal["none", "selective", "full"] = "none"
    flash_attention: bool = True
    kernels: Kernels = "fused"  # megatron's norms and rotary embedding: Transformer Engine's or torch's
    ep: ArrayOrNumber = 1
    dispatcher: Dispatcher = "alltoall"  # megatron-core's token dispatcher (train.moe.dispatcher)
    # routed copies this GPU's experts receive, over the mean top_k per token (moe_load.py: the worst EP
    # rank's imbalance, capped or padded by a capacity factor)
    routed_load: ArrayOrNumber = 1.0
    sent_load: ArrayOrNumber = 1.0  # copies a GPU sends over top_k per token: the capacity factor when padded
    # bytes per element of a GEMM input Transformer Engine saves quantized for the weight gradient under
    # train.precision=fp8/fp4 (compiler/models/recipes.py `Recipe.saved_input_bytes`); None = saved as is
    quantized_input_bytes: float | None = None
    # the CPU target: megatron's jit_fuser functions (swiglu_back) run eagerly, and what a GPU keeps in host
    # memory (RNG states, the step's inputs) shares the device's
    cpu: bool = False


def layer_shape(m: ModelSpec, moe_layer: bool) -> LayerShape:
    heads = m.num_attention_heads
    if m.attention == "mla":
        assert m.mla is not None
        a = m.mla
        qk = a.qk_nope_head_dim + a.qk_rope_head_dim
        base = LayerShape(
            hidden=m.hidden_size,
            heads=heads,
            q_width=heads * qk,
            k_width=heads * qk,
            v_width=heads * a.v_head_dim,
            out_width=heads * a.v_head_dim,
            q_latent=a.q_lora_rank or 0,
            kv_latent=a.kv_lora_rank,
            rope_width=a.qk_rope_head_dim,
            rotary_dim=a.qk_rope_head_dim,
        )
    else:
        kv = m.num_kv_heads * m.head_dim
        base = LayerShape(
            hidden=m.hidden_size,
            heads=heads,
            q_width=heads * m.head_dim,
            k_width=kv,
            v_width=kv,
            out_width=heads * m.head_dim,
            rotary_dim=m.head_dim,
        )
    if not moe_layer:
        return replace(base, ffn=m.ffn_hidden_size)
    assert m.moe is not None
    return replace(
        base,
        ffn=m.moe.num_shared_experts * m.moe.ffn_hidden_size,
        expert_ffn=m.moe.ffn_hidden_size,
        top_k=m.moe.top_k,
        experts=m.moe.num_experts,
    )


def _torch_norm_bytes(width: int, e: int) -> float:
    """torch's RMSNorm: fp32 input, rsqrt, fp32 normalised input, and its output (the next layer's input)."""
    return 2 * width * FP32_BYTES + FP32_BYTES + width * e


def _megatron_token_bytes(x: LayerShape, a: ActivationSetting, scores: bool) -> tuple[float, float]:
    """(replicated, tensor-parallel-sharded) bytes per token of one layer, Korthikanti style."""
    e, h = a.element_bytes, x.hidden
    # a GEMM input only its GEMM saves: in the low precision where TE quantizes it (`quantized_input_bytes`)
    q = e if a.quantized_input_bytes is None else a.quantized_input_bytes
    masks = 2 * h * MASK_BYTES if x.dropout else 0
    latents = [w for w in (x.q_latent, x.kv_latent) if w]
    # norm inputs (2) and outputs (the QKV and MLP inputs); MLA: each latent norm's input and output
    if a.kernels == "torch":
        replicated = sum(_torch_norm_bytes(w, e) for w in (h, h, *latents))
    else:
        replicated = (2 * h + sum(latents)) * (e + q)
    replicated += x.rope_width * e + masks  # MLA's shared rotary key, stored beside the kv latent
    seq = a.seq_length // a.cp
    repeated = scores and x.k_width < x.q_width  # unfused attention repeats grouped K/V to every head
    k_width, v_width = (x.q_width, x.out_width) if repeated else (x.k_width, x.v_width)
    if a.kernels == "torch" and not x.kv_latent and not repeated:
        v_width = x.q_width + x.k_width + x.v_width  # the value keeps the QKV output's storage alive
    sharded: float = (x.q_width + k_width + v_width + x.out_width) * e
    if a.quantized_input_bytes is not None:  # the output projection's own quantized copy of the attention
        sharded += x.out_width * a.quantized_input_bytes  # output, which attention keeps in bf16 for its backward
    if scores:  # softmax output (+ GPT's dropout mask and dropout output)
        sharded += x.heads * seq * (e + (MASK_BYTES + e if x.dropout else 0))
    elif a.flash_attention:  # the kernel's softmax log-sum-exp
        sharded += x.heads * FP32_BYTES
    sharded += (2 if x.gated else 1) * x.ffn * e + x.ffn * q  # fc1's output (gated: gate and up); fc2's input
    if x.top_k:
        # router: logits and probabilities (fp32) and routing map over all experts, top-k indices and
        # scores, their sum
        replicated += x.experts * (2 * FP32_BYTES + MASK_BYTES) + x.top_k * (INDEX_BYTES + FP32_BYTES) + FP32_BYTES
        received = x.top_k * a.routed_load  # copies this GPU's experts take, per token
        # per copy received: the permuted input, its probability; per copy the permutation's index (the
        # sender's under alltoall/flex; allgather permutes on the receiver, beside its local routing map)
        replicated = replicated + received * (h * q + FP32_BYTES)
        if a.dispatcher == "allgather":
            replicated = replicated + received * INDEX_BYTES + x.experts * MASK_BYTES
        else:
            replicated = replicated + x.top_k * a.sent_load * INDEX_BYTES
        routed = received * (2 * e + q) * x.expert_ffn / a.etp  # fc1 (gate, up) and SwiGLU (fc2's input) outputs
        sharded = sharded + routed  # not in place: on arrays `sharded` may be int64
    return replicated, sharded


def _rope_bytes(x: LayerShape, a: ActivationSetting) -> float:
    """The local path's unfused rotary embedding: cos and sin of the query and key rotations, once
    per layer and sequence (the batch broadcasts over them)."""
    return 4 * (a.seq_length // a.cp) * x.rotary_dim * FP32_BYTES if a.kernels == "torch" else 0.0


def _hf_norm_bytes(width: int, a: ActivationSetting) -> ArrayOrNumber:
    """A transformers RMSNorm per token: its fp32 input copy, rsqrt and normalised input, on this rank's
    sequence shard under sequence parallelism, and its output as the next linear layers save it (whole: the
    tensor-parallel plan gathers the sequence for them, torchtitan's PrepareModuleInput)."""
    sp = a.tp if a.sequence_parallel else 1
    return (width * FP32_BYTES + FP32_BYTES + width * a.element_bytes) / sp + width * a.element_bytes


def _hf_token_bytes(x: LayerShape, a: ActivationSetting, scores: bool) -> ArrayOrNumber:
    """Bytes per token of one layer of the HuggingFace modeling code, as measured; under tensor parallelism
    (torchtitan's plan: runtime/train/torchtitan/tensor_parallel.py) the attention heads and the MLP's
    width are split over the TP ranks, the norms along the sequence (`_hf_norm_bytes`). MLA and MoE layers
    have no TP plan there (the capability table refuses them): their parts are priced whole."""
    e, h = a.element_bytes, x.hidden

    def norm(width: int) -> ArrayOrNumber:
        return _hf_norm_bytes(width, a)

    total = 2 * norm(h)  # never added to in place: tp may be an array of another shape than the widths
    seq = a.seq_length // a.cp
    if x.kv_latent:
        total = total + (norm(x.q_latent) if x.q_latent else 0) + norm(x.kv_latent)
        # kv_b output (keys without rope and values) stored as the values' storage; the query and
        # key with rope concatenated; scores; output projection input
        total = total + (x.q_width + x.k_width + x.k_width - x.heads * x.rope_width + x.v_width + x.out_width) * e
    elif scores:  # eager: K and V repeated to every query head (this rank's heads)
        total = total + (2 * x.q_width + 2 * x.out_width) * e / a.tp
    else:  # sdpa flash kernel: Q, K, V, the output (also the projection's input), log-sum-exp
        total = total + ((x.q_width + x.k_width + x.v_width + x.out_width) * e + x.heads * FP32_BYTES) / a.tp
    if scores:
        total = total + x.heads / a.tp * seq * (FP32_BYTES + (e if e != FP32_BYTES else 0))
    gated_mlp = 4  # gate output, SiLU output, up output, their product
    total = total + gated_mlp * x.ffn * e / a.tp
    if x.top_k:
        # router: fp32 input copy (bf16 only), sigmoid scores; per routed copy: gathered input,
        # gate/up output, SiLU output, product, weighted output, its weight and token index
        total = total + (h * FP32_BYTES if e != FP32_BYTES else 0) + x.experts * FP32_BYTES
        total = total + x.top_k * ((2 * h + gated_mlp * x.expert_ffn) * e + FP32_BYTES + INDEX_BYTES)
    return total


def _hf_op_checkpoint_token_bytes(x: LayerShape, a: ActivationSetting) -> ArrayOrNumber:
    """Bytes per token torchtitan's per-op checkpoint policy keeps of one dense layer of the HuggingFace
    modeling code (runtime/train/torchtitan/activation_checkpoint.py): the layer's input (its sequence shard
    under sequence parallelism) and the saved ops' outputs. Of the layer's seven matmuls (q, k, v, o, gate, up,
    down in that order; eager attention's score and context products are batched matmuls, not among them) the
    1st, 3rd, 5th and 7th: q, v, gate and down's output (a partial sum over the whole sequence before its
    reduce-scatter under TP); sdpa's output and log-sum-exp; under TP the two reduce-scatter outputs (o's and
    down's, sequence shards)."""
    e, h = a.element_bytes, x.hidden
    sp = a.tp if a.sequence_parallel else 1
    kept = (x.q_width + x.v_width + x.ffn) * e
    if a.flash_attention:
        kept = kept + x.out_width * e + x.heads * FP32_BYTES
    scattered = 2 * h * e / sp if a.sequence_parallel else 0.0
    return h * e / sp + kept / a.tp + h * e + scattered


def _op_checkpointed(x: LayerShape, a: ActivationSetting) -> bool:
    """Whether torchtitan's per-op policy is priced for this layer (`_hf_op_checkpoint_token_bytes`): dense
    layers; a MoE or MLA layer is priced as it runs without checkpointing, which keeps more."""
    return a.style == "hf" and a.recompute == "selective" and not (x.top_k or x.kv_latent)


def layer_activation_bytes(x: LayerShape, a: ActivationSetting) -> float:
    """Bytes one layer keeps for backward for one micro-batch, on one GPU."""
    tokens = a.seq_length // a.cp * a.micro_batch_size
    if a.recompute == "full":
        rng = RNG_STATES * RNG_STATE_BYTES * (a.cpu and a.style == "megatron")
        return residual_bytes(x.hidden, a) + rng
    scores = not a.flash_attention and a.recompute != "selective"
    if a.recompute == "selective" and a.style == "megatron":  # its core attention checkpoint's RNG states
        rng = (RNG_STATES + 1) * RNG_STATE_BYTES * a.cpu  # and the state the attention's dropout fork keeps
    else:
        rng = 0
    if _op_checkpointed(x, a):
        return tokens * _hf_op_checkpoint_token_bytes(x, a)
    if a.style == "hf":
        return tokens * _hf_token_bytes(x, a, not a.flash_attention)
    replicated, sharded = _megatron_token_bytes(x, a, scores)
    return tokens * (replicated / (a.tp if a.sequence_parallel else 1) + sharded / a.tp) + _rope_bytes(x, a) + rng


def dispatched_tokens(a: ActivationSetting) -> ArrayOrNumber:
    """Tokens of one micro-batch a GPU's router and token dispatcher see: the sequence shard of cp, and of
    tp under sequence parallelism (megatron refuses MoE training at tp > 1 without it)."""
    return a.seq_length // a.cp * a.micro_batch_size / (a.tp if a.sequence_parallel else 1)


def moe_transient_bytes(x: LayerShape, a: ActivationSetting) -> ArrayOrNumber:
    """The most a MoE layer holds while it runs beyond what it saves for backward: the dispatcher's
    buffers and the permuted copies alive during its forward (its backward holds less), per micro-batch.

    T tokens per GPU (`dispatched_tokens`), S = T top_k x sent_load copies sent, R = T top_k x routed_load
    received, h x element bytes each:
    - alltoall: S + (2 + [ep > 1]) R: the permuted input (S), the dispatch all-to-all's output (R, a new
      buffer only at ep > 1: megatron's _AllToAll returns its input on a group of one), the experts' output
      (R) and its un-sort by local expert (R) are alive together (MoELayer.forward's locals, then
      sort_chunks_by_idxs); the combine all-to-all returns S copies as they go. Backward holds less.
    - allgather: T ep + 2 R, and the gathered fp32 probabilities over all experts (T ep x experts): the
      EP group's gathered tokens (megatron's global memory buffer: allocated once and kept, priced here as
      the working memory it is; measured apart from the 2 R, which a later pass shows alone), the experts'
      outputs and their concatenation (the un-permute's T ep output comes after they are freed).
    - flex (DeepEP; priced from megatron-core 0.16.1's source, token_dispatcher.py and fused_a2a.py, not
      measured: it needs GPUs): 2 N + R + T, where N = T x min(top_k, ep) x routed_load tokens arrive (a
      token is sent once per destination rank, at most top_k of them): the received tokens, the experts'
      output, its un-permuted N copies and the combined T. DeepEP's own NVLink/RDMA buffers, allocated once
      per process (Buffer(group, num_nvl_bytes, num_rdma_bytes)), are not priced.
    Measured for alltoall and allgather at ep=2 on CPU (tests/models/test_measured_moe.py): the forward's
    peak over what was held when the layer began, less the layer's saved bytes."""
    if not x.top_k or a.style != "megatron":  # the HF code DeepSpeed trains: no dispatcher, not measured
        return 0.0
    tokens = dispatched_tokens(a)
    sent = tokens * x.top_k * a.sent_load
    received = tokens * x.top_k * a.routed_load
    copy = x.hidden * a.element_bytes
    if a.dispatcher == "allgather":
        gathered = tokens * a.ep
        return (gathered + 2 * received) * copy + gathered * x.experts * FP32_BYTES
    if a.dispatcher == "flex":
        arrived = tokens * smaller(a.ep, x.top_k) * a.routed_load
        return (2 * arrived + received + tokens) * copy
    return (sent + (2 + (a.ep > 1)) * received) * copy


def working_layer_bytes(x: LayerShape, a: ActivationSetting) -> ArrayOrNumber:
    """What one layer holds, while it runs, beyond what every layer saves: full recompute rebuilds one
    layer's activations at a time during backward, torchtitan's per-op policy what it did not keep of them;
    a MoE layer's dispatch buffers and permuted copies (`moe_transient_bytes`), rebuilt with it under full
    recompute."""
    whole = layer_activation_bytes(x, replace(a, recompute="none"))
    rebuilt = (
        whole if a.recompute == "full" else whole - layer_activation_bytes(x, a) if _op_checkpointed(x, a) else 0.0
    )
    return rebuilt + moe_transient_bytes(x, a)


def residual_bytes(hidden: int, a: ActivationSetting) -> ArrayOrNumber:
    """One micro-batch's residual stream on one GPU: the sequence shard of cp, and of tp under sequence
    parallelism."""
    tokens = a.seq_length // a.cp * a.micro_batch_size
    return tokens * hidden * a.element_bytes / (a.tp if a.sequence_parallel else 1)


def _mlp_backward_bytes(x: LayerShape, a: ActivationSetting) -> ArrayOrNumber:
    """A dense MLP's backward beyond what the layer saved, net of fc2's saved input it has released: the
    residual stream's gradient, fc2's data gradient (f/tp), swiglu_back's output (2f/tp gated) and, where
    megatron's fusions run eagerly (the CPU target), the two halves it concatenates (2f/tp). MoE layers'
    expert MLPs are smaller than their forward's dispatch buffers (`moe_transient_bytes`)."""
    tokens = a.seq_length // a.cp * a.micro_batch_size
    f = 0 if x.top_k else x.ffn
    out = (2 if x.gated else 1) * f + (2 * f if x.gated and a.cpu else 0)
    return residual_bytes(x.hidden, a) + tokens * a.element_bytes * out / a.tp


def _attention_backward_bytes(x: LayerShape, a: ActivationSetting) -> ArrayOrNumber:
    """Selective recompute's rebuilt core attention in backward (megatron's local DotProductAttention): the
    residual gradient, the output projection's data gradient and dV, K and V repeated to every query head
    (GQA), and the score-sized tensors of the softmax's backward, net of the layer's MLP block and attention
    output already released."""
    tokens, e = a.seq_length // a.cp * a.micro_batch_size, a.element_bytes
    s = a.seq_length // a.cp
    sp = a.tp if a.sequence_parallel else 1
    repeated = x.k_width < x.q_width
    held = residual_bytes(x.hidden, a) + tokens * e * (2 * x.out_width + (x.q_width + x.out_width) * repeated) / a.tp
    # the local path's masked_fill_ on a view makes autograd copy the scores whole: four score-sized
    # tensors (measured); a fused masked softmax (Transformer Engine's unfused attention) holds its output's
    # and its input's gradients, two (from source, not measured)
    copies = 4 if a.kernels == "torch" else 2
    held = held + copies * a.micro_batch_size * x.heads / a.tp * s * a.seq_length * e
    norm = _torch_norm_bytes(x.hidden, e) if a.kernels == "torch" else 2 * x.hidden * e
    released = tokens * (norm / sp + ((2 if x.gated else 1) * x.ffn + x.ffn + x.out_width) * e / a.tp)
    return held - released


def backward_working_bytes(x: LayerShape, a: ActivationSetting) -> ArrayOrNumber:
    """What the backward of a stage's last layer holds beyond every layer's saved activations (measured on
    the runtime's own layers, tests/models/test_measured_step_memory.py): under full recompute the layer
    rebuilt, then its MLP's backward; under selective recompute with unfused attention the rebuilt
    attention's backward; else the MLP's backward. The transformers code DeepSpeed trains peaks in its
    loss (`head_working_bytes`): 0 here."""
    if a.style != "megatron":
        return 0.0
    if a.recompute == "selective" and not a.flash_attention:
        return _attention_backward_bytes(x, a)
    rebuilt = layer_activation_bytes(x, replace(a, recompute="none")) if a.recompute == "full" else 0.0
    return rebuilt + _mlp_backward_bytes(x, a)


def head_activation_bytes(m: ModelSpec, a: ActivationSetting) -> float:
    """Last stage: final norm, output-head input and fp32 log-softmax of the logits."""
    tokens = a.seq_length // a.cp * a.micro_batch_size
    h, v, e = m.hidden_size, m.vocab_size, a.element_bytes
    if a.style == "hf":  # the logits are gathered whole under TP (torchtitan's plan without loss parallelism)
        return tokens * (_hf_norm_bytes(h, a) + v * FP32_BYTES + 2 * INDEX_BYTES)
    sp = a.tp if a.sequence_parallel else 1
    norm = _torch_norm_bytes(h, e) if a.kernels == "torch" else 2 * h * e
    # the cross-entropy's fp32 softmax of the logits, its target mask and flattened labels
    return tokens * (norm / sp + v * FP32_BYTES / a.tp + MASK_BYTES + INDEX_BYTES)


def head_working_bytes(m: ModelSpec, a: ActivationSetting) -> ArrayOrNumber:
    """What the last stage's head holds in backward beyond what it saved.

    - transformers' loss (`hf`): the gradient of its fp32 log-softmax (nll_loss_backward), then the logits'
      gradient (_log_softmax_backward_data) while the first is alive: two fp32 copies of the logits (under
      bf16 the upcast's backward then holds the fp32 gradient and its bf16 copy, less than the two).
    - megatron: vocab-parallel cross-entropy works in place in the logits; the output layer's backward
      makes its input's gradient over the whole sequence (and its reduce-scatter under sequence
      parallelism) and, without gradient-accumulation fusion (the local path), its weight gradient
      (V/tp x h) before adding it into the fp32 main gradient; then torch's final RMSNorm's backward holds
      five residual-sized temporaries, by when all it saved but its fp32 input is freed."""
    tokens = a.seq_length // a.cp * a.micro_batch_size
    h, e = m.hidden_size, a.element_bytes
    if a.style == "hf":
        return 2 * tokens * m.vocab_size * FP32_BYTES
    sp = a.tp if a.sequence_parallel else 1
    output_layer = tokens * h * e * (1 + (1 / a.tp if a.sequence_parallel else 0))
    if a.kernels == "torch":
        output_layer = output_layer + m.vocab_size / a.tp * h * e
        kept = tokens * h * FP32_BYTES / sp  # its fp32 input (the normalised input and rsqrt are freed by then)
        norm = 5 * residual_bytes(h, a) - (head_activation_bytes(m, a) - kept)
        return larger(output_layer, norm)
    return output_layer


def persistent_buffer_bytes(m: ModelSpec, a: ActivationSetting) -> ArrayOrNumber:
    """Buffers beside the model state that a step holds throughout. transformers (`hf`): the position ids
    (b x s, int64) and, for eager attention, the boolean causal mask (s x s) each forward builds. Megatron's
    local path allocates once and keeps all run: megatron-core's
    GlobalMemoryBuffer "mpu" (utils.py), the input DotProductAttention's baddbmm is given (b x heads/tp x
    s x s; non-MLA unfused attention) and the sequence-parallel all-gathers of the linear layers' inputs
    (s x b x h), the larger of the two; lmspec's trainer's boolean causal mask (s x s) and position ids
    (b x s, int64), the rotary embedding's cached fp32 frequencies, and on the CPU target the RNG tracker's states.
    Transformer Engine keeps its own."""
    s, e = a.seq_length // a.cp, a.element_bytes
    positions = a.micro_batch_size * a.seq_length * INDEX_BYTES
    if a.style == "hf":  # eager attention's boolean causal mask (sdpa's kernel is causal without one)
        return positions + (0 if a.flash_attention else a.seq_length * a.seq_length * MASK_BYTES)
    if a.kernels != "torch":
        return 0.0
    scores = a.micro_batch_size * m.num_attention_heads / a.tp * s * s * e
    scores = scores * (not a.flash_attention and m.attention != "mla")
    gathered = s * a.micro_batch_size * m.hidden_size * e * (a.sequence_parallel and a.tp > 1)
    rotary = (m.mla.qk_rope_head_dim if m.mla is not None else m.head_dim) * FP32_BYTES
    rng = (RNG_STATES + 1) * RNG_STATE_BYTES * a.cpu  # and the state the attention's dropout fork keeps
    mask = a.seq_length * a.seq_length * MASK_BYTES
    return larger(scores, gathered) + mask + positions + a.seq_length * rotary + rng


def step_input_bytes(a: ActivationSetting) -> ArrayOrNumber:
    """One micro-batch's token ids and labels (int64) that lmspec's loop holds for a whole step: all of the
    step's micro-batches are read before it begins (runtime/train/loop.py), in device memory only on the
    CPU target (on a GPU each is copied over as it runs, and its ids are priced as the embedding's)."""
    return 2 * INDEX_BYTES * a.seq_length * a.micro_batch_size if a.cpu else 0.0


def pipeline_held_bytes(pp: Any, stage: Any, virtual_stages: Any, micro_batches: Any, residual: Any) -> Any:
    """What megatron's pipeline schedules hold beside the activations on `stage`, in residual-stream tensors
    (`residual`: one micro-batch's, this GPU's share). Every model chunk but the model's first keeps its last
    input and that input's retained gradient (TransformerBlock.set_input_tensor; schedules.py's
    retain_grad); under 1F1B a stage past the first holds the previous micro-batch's input gradient while the
    next backward runs, under interleaving two more receive and gradient buffers per such chunk and two more
    (measured 2 on the first stage, 6 on the last at 2 x 2 chunks). And each forward in flight keeps its
    output until its backward: megatron-core's default (deallocate_pipeline_outputs, which lmspec's build
    leaves off) frees none once sent; every stage but the last under 1F1B, every chunk forward under
    interleaving (an upper bound: the model's last chunk sends nothing). Plain arithmetic."""
    interleaved = virtual_stages > 1
    later_chunks = pick(interleaved, virtual_stages - (stage == 0), stage > 0)
    buffers = pick(interleaved, 4 * later_chunks + 2, 3 * later_chunks)
    chunk_forwards = smaller(2 * (pp - stage - 1) + (virtual_stages - 1) * pp + 1, virtual_stages * micro_batches)
    outputs = pick(interleaved, chunk_forwards, smaller(pp - stage, micro_batches) * (stage < pp - 1))
    return (buffers + outputs) * (pp > 1) * residual


def embedding_activation_bytes(a: ActivationSetting) -> float:
    """First stage: the token ids the embedding's backward scatters into; under TP also the mask of the
    ids outside this rank's vocabulary shard (megatron's VocabParallelEmbedding)."""
    return a.seq_length // a.cp * a.micro_batch_size * (INDEX_BYTES + MASK_BYTES * (a.tp > 1))
