"""Training FLOPs per token, after Megatron-LM's `num_floating_point_operations`.

Model FLOPs count each GEMM three times (forward, weight gradient, data gradient) at
2 FLOPs per multiply-add, so a token costs about 6 x its activated (non-embedding)
parameters, plus the causal attention term (half the s x s score matrix, for QK^T and
for scores x V). MoE layers count the top-k routed experts and the shared experts only.
The embedding lookup and routers are not counted (as in Megatron). Each multi-token-prediction
module (DeepSeek-V3) counts as Megatron counts it: one more layer like the last, its norms and
2h -> h projection, and one more output head.

Hardware FLOPs add the forward work that recomputation repeats: the core attention for
`selective`, every transformer layer's forward for `full`.
"""

from __future__ import annotations

from dataclasses import dataclass

from lmspec.compiler.models import ArrayOrNumber
from lmspec.compiler.models.params import MTP_NORMS, is_moe_layer
from lmspec.compiler.models.units import SECONDS_PER_DAY, TFLOPS
from lmspec.compiler.spec.sections import ModelSpec

FORWARD_BACKWARD_FACTOR = 3  # forward, backward data-gradient, backward weight-gradient GEMMs
FLOPS_PER_MAC = 2
GATED_LINEAR_MULTIPLIER = 1.5  # SwiGLU: three h x ffn matrices instead of two


@dataclass(frozen=True, kw_only=True)
class FlopsPerToken:
    """Model FLOPs of one token (forward + backward), split by what recompute repeats."""

    layer_gemms: float  # projections and MLPs of every transformer layer
    core_attention: float  # QK^T and scores x V (causal: half the matrix)
    logits: float  # output head

    @property
    def total(self) -> float:
        return self.layer_gemms + self.core_attention + self.logits


def flops_breakdown(model: ModelSpec, seq_length: int) -> FlopsPerToken:
    """Megatron's num_floating_point_operations / (batch x seq), kept in three parts."""
    m, s, h = model, seq_length, model.hidden_size
    fb = FORWARD_BACKWARD_FACTOR * FLOPS_PER_MAC
    mtp = m.mtp_layers
    last_is_moe = is_moe_layer(m, m.num_layers - 1)
    num_moe = sum(is_moe_layer(m, i) for i in range(m.num_layers)) + mtp * last_is_moe
    num_layers = m.num_layers + mtp  # an MTP module's layer is the decoder's last layer
    num_dense = num_layers - num_moe
    mlp_width = m.ffn_hidden_size * num_dense
    if m.moe is not None:
        mlp_width += m.moe.ffn_hidden_size * (m.moe.top_k + m.moe.num_shared_experts) * num_moe
    mlp = mlp_flops_per_token(h, mlp_width)
    heads = m.num_attention_heads
    if m.attention == "mla":
        assert m.mla is not None
        a = m.mla
        qk = a.qk_nope_head_dim + a.qk_rope_head_dim
        q = h * heads * qk if a.q_lora_rank is None else a.q_lora_rank * (h + heads * qk + 1)
        kv = a.kv_lora_rank * (h + heads * (a.qk_nope_head_dim + a.v_head_dim) + 1) + h * a.qk_rope_head_dim
        projections: float = fb * num_layers * (q + kv + heads * a.v_head_dim * h)
        core = fb * num_layers * (s * heads * qk / 2 + s * heads * a.v_head_dim / 2)
    else:
        q_width = heads * m.head_dim
        # Q and O (h x q_width), K and V (h x kv_width): 2 GEMMs each pair
        projections = fb * 2 * num_layers * h * q_width * (1 + m.num_kv_heads / heads)
        core = fb * 2 * num_layers * q_width * s / 2
    mtp_own = fb * mtp * (MTP_NORMS * h + 2 * h * h)  # its norms and eh_proj, as Megatron counts them
    logits = fb * h * m.vocab_size * (1 + mtp)  # every MTP module has its own pass through the head
    return FlopsPerToken(layer_gemms=mlp + projections + mtp_own, core_attention=core, logits=logits)


def mlp_flops_per_token(hidden: int, width: float) -> float:
    """Two hidden x width GEMMs per MLP (x1.5 for the gate), as Megatron's 12 = 3 x 2 x 2."""
    return FORWARD_BACKWARD_FACTOR * FLOPS_PER_MAC * 2 * hidden * width * GATED_LINEAR_MULTIPLIER


def routed_expert_flops_per_token(model: ModelSpec) -> float:
    """Model FLOPs per token of one MoE layer's top-k routed experts (0 for a dense model)."""
    moe = model.moe
    return mlp_flops_per_token(model.hidden_size, moe.ffn_hidden_size * moe.top_k) if moe else 0.0


def model_flops_per_token(model: ModelSpec, seq_length: int) -> float:
    """Training model FLOPs per token (forward + backward), as Megatron reports them."""
    return flops_breakdown(model, seq_length).total


def hardware_flops_per_token(model: ModelSpec, seq_length: int, recompute: str) -> float:
    """Model FLOPs plus the forward work recomputation repeats (none, selective, full)."""
    f = flops_breakdown(model, seq_length)
    extra = {
        "none": 0.0,
        "selective": f.core_attention / FORWARD_BACKWARD_FACTOR,
        "full": (f.layer_gemms + f.core_attention) / FORWARD_BACKWARD_FACTOR,
    }[recompute]
    return f.total + extra


def mfu(
    tokens_per_s: ArrayOrNumber, flops_per_token: float, n_gpus: ArrayOrNumber, peak_tflops: float
) -> ArrayOrNumber:
    """Achieved FLOP/s over the GPUs' dense peak: model FLOPs give MFU, hardware FLOPs HFU
    (per candidate, on arrays, in compiler/search)."""
    return tokens_per_s * flops_per_token / (n_gpus * peak_tflops * TFLOPS)


def tokens_per_s(tokens_per_step: int, step_time_s: float) -> float:
    return tokens_per_step / step_time_s


def days_for_tokens(tokens: float, tokens_per_second: float) -> float:
    return tokens / tokens_per_second / SECONDS_PER_DAY
