"""Exact parameter counts of the decoder architectures lmspec knows, per component.

Counts follow the HuggingFace implementations the converted checkpoints load into
(LlamaForCausalLM, MixtralForCausalLM, DeepseekV2/V3ForCausalLM): no biases, RMSNorm
weights only, SwiGLU MLPs (gate, up, down). "Active" is every parameter one token
passes through: embedding and output head included, only the top-k routed experts
(the convention behind Mixtral's 12.9B and DeepSeek-V3's 37B). DeepSeek-V3's
multi-token-prediction module is counted apart (`mtp`), not in `total`. DeepSeek-V3's
router score-correction bias is a buffer updated by the balancing rule, not by the
optimizer (HF and Megatron both keep it as a buffer), so it is not a parameter here either.
"""

from __future__ import annotations

from dataclasses import dataclass

from lmspec.compiler.spec.sections import ModelSpec, Spec

GATED_MLP_MATRICES = 3  # gate, up, down projections of a SwiGLU MLP


@dataclass(frozen=True, kw_only=True)
class LayerParams:
    """One decoder layer, split the way parallelism shards it."""

    attention: int  # projections (incl. MLA down/up projections and their norms)
    attention_norms: int  # RMSNorm weights inside attention (MLA latent norms); replicated under TP
    layer_norms: int  # the two pre-norms; replicated under TP
    dense_mlp: int  # dense MLP (dense layers) or shared experts (MoE layers)
    router: int  # router weight; replicated under TP
    routed_experts: int  # all routed experts; sharded by EP
    routed_expert_one: int  # one routed expert

    @property
    def total(self) -> int:
        return (
            self.attention
            + self.attention_norms
            + self.layer_norms
            + self.dense_mlp
            + self.router
            + self.routed_experts
        )


@dataclass(frozen=True, kw_only=True)
class ParamCounts:
    """Parameter counts of a model, total and activated per token, by component."""

    embedding: int
    output_head: int  # 0 when tied to the embedding
    final_norm: int
    attention: int  # all layers, including MLA latent norms
    norms: int  # the layers' pre-norms and the final norm
    dense_mlp: int  # dense layers' MLPs
    shared_experts: int
    routed_experts: int
    router: int
    mtp: int  # DeepSeek-V3 multi-token prediction modules (not in total)
    mtp_replicated: int  # of `mtp`: norms and router, whole on every TP rank
    mtp_expert: int  # of `mtp`: routed experts, sharded by EP
    total: int
    active: int
    expert: int  # parameters inside routed experts (sharded by EP, not TP/DP alone)
    largest_layer: int  # largest single module of the HF model (ZeRO-3 gathers one module at a time)

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


def attention_params(m: ModelSpec) -> tuple[int, int]:
    """(projection parameters, latent-norm parameters) of one attention block."""
    h, heads = m.hidden_size, m.num_attention_heads
    if m.attention == "gqa":
        q = h * heads * m.head_dim
        kv = 2 * h * m.num_kv_heads * m.head_dim
        bias = (heads + 2 * m.num_kv_heads) * m.head_dim if m.qkv_bias else 0  # Qwen2: q, k, v; none on o
        qk_norms = 2 * m.head_dim if m.qk_norm else 0  # Qwen3: one RMSNorm weight over head_dim for q, one for k
        return q + kv + bias + heads * m.head_dim * h, qk_norms
    assert m.mla is not None, "validate() guarantees mla ranks for attention=mla"
    mla = m.mla
    qk_head = mla.qk_nope_head_dim + mla.qk_rope_head_dim
    if mla.q_lora_rank is None:
        q, q_norm = h * heads * qk_head, 0
    else:
        q, q_norm = h * mla.q_lora_rank + mla.q_lora_rank * heads * qk_head, mla.q_lora_rank
    kv_down = h * (mla.kv_lora_rank + mla.qk_rope_head_dim)
    kv_up = mla.kv_lora_rank * heads * (mla.qk_nope_head_dim + mla.v_head_dim)
    out = heads * mla.v_head_dim * h
    return q + kv_down + kv_up + out, q_norm + mla.kv_lora_rank


def attention_linears(m: ModelSpec) -> tuple[int, ...]:
    """Parameters of each projection matrix of one attention block."""
    h, heads = m.hidden_size, m.num_attention_heads
    if m.attention == "gqa":
        q, kv = h * heads * m.head_dim, h * m.num_kv_heads * m.head_dim
        return q, kv, kv, q
    assert m.mla is not None
    a = m.mla
    qk = a.qk_nope_head_dim + a.qk_rope_head_dim
    q_linears = (h * heads * qk,) if a.q_lora_rank is None else (h * a.q_lora_rank, a.q_lora_rank * heads * qk)
    return (
        *q_linears,
        h * (a.kv_lora_rank + a.qk_rope_head_dim),
        a.kv_lora_rank * heads * (a.qk_nope_head_dim + a.v_head_dim),
        heads * a.v_head_dim * h,
    )


def is_moe_layer(m: ModelSpec, index: int) -> bool:
    return m.moe is not None and index >= m.moe.first_dense_layers


def layer_params(m: ModelSpec, index: int) -> LayerParams:
    """Parameters of decoder layer `index` (0-based): dense and MoE layers differ."""
    h = m.hidden_size
    attention, attention_norms = attention_params(m)
    if not is_moe_layer(m, index):
        return LayerParams(
            attention=attention,
            attention_norms=attention_norms,
            layer_norms=2 * h,
            dense_mlp=GATED_MLP_MATRICES * h * m.ffn_hidden_size,
            router=0,
            routed_experts=0,
            routed_expert_one=0,
        )
    moe = m.moe
    assert moe is not None
    one = GATED_MLP_MATRICES * h * moe.ffn_hidden_size
    return LayerParams(
        attention=attention,
        attention_norms=attention_norms,
        layer_norms=2 * h,
        dense_mlp=moe.num_shared_experts * one,
        router=moe.num_experts * h,
        routed_experts=moe.num_experts * one,
        routed_expert_one=one,
    )


MTP_NORMS = 3  # enorm (embedding), hnorm (hidden state), and the norm before the shared head


def mtp_layer(m: ModelSpec) -> LayerParams:
    """The decoder layer inside each MTP module: megatron-core builds it from the decoder's last layer
    spec (DeepSeek-V3: an MoE layer); DeepSeek-V3's release has the same layer under model.layers.61."""
    return layer_params(m, m.num_layers - 1)


def mtp_params(m: ModelSpec) -> int:
    """The DeepSeek-V3 MTP modules: per module its norms, the 2h -> h projection `eh_proj` and one decoder
    layer; embedding and output head are shared with the model (the release stores copies of them)."""
    h = m.hidden_size
    return m.mtp_layers * (MTP_NORMS * h + 2 * h * h + mtp_layer(m).total)


def mtp_replicated_params(m: ModelSpec) -> int:
    """Of `mtp_params`, what every TP rank keeps whole: norms and router."""
    layer = mtp_layer(m)
    return m.mtp_layers * (MTP_NORMS * m.hidden_size + layer.attention_norms + layer.layer_norms + layer.router)


def computable(spec: Spec) -> bool:
    """The models need a coherent architecture (MLA with its ranks); the model rules report one that is not,
    and every rule priced by the models asks this first."""
    return spec.model.attention != "mla" or spec.model.mla is not None


def count_params(m: ModelSpec) -> ParamCounts:
    """Every component of the model, exactly. A model has two kinds of layer (dense, then MoE
    from moe.first_dense_layers on), so each sum is a count times one layer: O(1) in num_layers."""
    h = m.hidden_size
    n_dense = m.num_layers if m.moe is None else min(m.moe.first_dense_layers, m.num_layers)
    n_moe = m.num_layers - n_dense
    dense_layer, moe_layer = layer_params(m, 0), layer_params(m, m.num_layers - 1)
    kinds = [(n, layer) for n, layer in ((n_dense, dense_layer), (n_moe, moe_layer)) if n]
    embedding = m.vocab_size * h
    output_head = 0 if m.tie_embeddings else m.vocab_size * h
    top_k = m.moe.top_k if m.moe is not None else 0
    attention = sum(n * (layer.attention + layer.attention_norms) for n, layer in kinds)
    norms = sum(n * layer.layer_norms for n, layer in kinds) + h
    routed = n_moe * moe_layer.routed_experts
    total = embedding + output_head + sum(n * layer.total for n, layer in kinds) + h
    active = total - routed + n_moe * top_k * moe_layer.routed_expert_one
    moe_largest = (moe_layer.routed_experts, moe_layer.dense_mlp // GATED_MLP_MATRICES) if n_moe else ()
    largest_layer = max(embedding, output_head, *attention_linears(m), h * m.ffn_hidden_size, *moe_largest)
    return ParamCounts(
        embedding=embedding,
        output_head=output_head,
        final_norm=h,
        attention=attention,
        norms=norms,
        dense_mlp=n_dense * dense_layer.dense_mlp,
        shared_experts=n_moe * moe_layer.dense_mlp,
        routed_experts=routed,
        router=n_moe * moe_layer.router,
        mtp=mtp_params(m),
        mtp_replicated=mtp_replicated_params(m),
        mtp_expert=m.mtp_layers * mtp_layer(m).routed_experts,
        total=total,
        active=active,
        expert=routed,
        largest_layer=largest_layer,
    )
