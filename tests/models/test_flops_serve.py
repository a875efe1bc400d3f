"""FLOPs per token against Megatron-LM's `num_floating_point_operations` (transcribed here, since
megatron-core ships without megatron.training), MFU arithmetic, and vLLM's KV cache sizes."""

from __future__ import annotations

import math

import pytest
from helpers.specs import spec_of

from lmspec.compiler.models.flops import hardware_flops_per_token, mfu, model_flops_per_token
from lmspec.compiler.models.params import count_params
from lmspec.compiler.models.serve_memory import estimate_serve_memory, kv_bytes_per_token


def megatron_flops(m, seq: int) -> float:  # noqa: ANN001
    """Megatron-LM training.py num_floating_point_operations(args, batch_size=1) / seq_length."""
    expansion = 3 * 2 * 2
    swiglu = 3 / 2
    layers = m.num_layers
    if m.moe is None:
        dense, moe_layers, topk, moe_ffn, shared_ffn, last_is_moe = layers, 0, 0, 0, 0, 0
    else:
        moe_layers = layers - m.moe.first_dense_layers
        dense, topk, moe_ffn = m.moe.first_dense_layers, m.moe.top_k, m.moe.ffn_hidden_size
        shared_ffn = m.moe.ffn_hidden_size * m.moe.num_shared_experts
        last_is_moe = 1
    mtp = m.mtp_layers  # each MTP layer counts as one more layer of the last layer's kind
    moe_layers += last_is_moe * mtp
    dense += (1 - last_is_moe) * mtp
    layers += mtp
    h, a = m.hidden_size, m.num_attention_heads
    if m.attention == "mla":
        x = m.mla
        q_term = (
            h * a * (x.qk_nope_head_dim + x.qk_rope_head_dim)
            if x.q_lora_rank is None
            else x.q_lora_rank * (h + a * (x.qk_nope_head_dim + x.qk_rope_head_dim) + 1)
        )
        attn = (
            3
            * 2
            * layers
            * (
                q_term
                + x.kv_lora_rank * (h + a * (x.qk_nope_head_dim + x.v_head_dim) + 1)
                + h * x.qk_rope_head_dim
                + a * x.v_head_dim * h
                + seq * (a * (x.qk_nope_head_dim + x.qk_rope_head_dim)) / 2
                + seq * a * x.v_head_dim / 2
            )
        )
    else:
        ratio = m.head_dim * a / h
        attn = expansion * layers * h * h * ((1 + m.num_kv_heads / a + seq / h / 2) * ratio)
    mlp = (
        expansion
        * layers
        * h
        * (
            m.ffn_hidden_size * swiglu * dense / layers
            + moe_ffn * topk * swiglu * moe_layers / layers
            + shared_ffn * swiglu * moe_layers / layers
        )
    )
    mtp_norms_and_proj = 3 * 2 * mtp * (3 * h + 2 * h * h)
    return mlp + attn + mtp_norms_and_proj + 3 * 2 * h * m.vocab_size * (mtp + 1)


@pytest.mark.parametrize(
    "preset", ["tiny", "tiny_moe", "llama3_8b", "llama3_70b", "mixtral_8x7b", "deepseek_v2_lite", "deepseek_v3"]
)
@pytest.mark.parametrize("seq", [128, 4096])
def test_model_flops_match_megatron(preset: str, seq: int) -> None:
    m = spec_of(f"model={preset}").model
    assert model_flops_per_token(m, seq) == pytest.approx(megatron_flops(m, seq), rel=1e-12)


@pytest.mark.parametrize("preset", ["llama3_8b", "mixtral_8x7b", "deepseek_v3"])
def test_about_six_times_active_parameters_not_the_seeds_2hl16(preset: str) -> None:
    m = spec_of(f"model={preset}").model
    counts = count_params(m)
    six_n = 6 * (counts.active - counts.embedding)  # the lookup is not a matmul
    flops = model_flops_per_token(m, 4096)
    assert six_n < flops < 1.25 * six_n  # the rest is causal attention
    assert flops > 5 * 2 * m.hidden_size * m.num_layers * 16


def test_recompute_adds_forward_work_and_mfu_arithmetic() -> None:
    m = spec_of("model=llama3_8b").model
    none, selective, full = (hardware_flops_per_token(m, 4096, r) for r in ("none", "selective", "full"))
    assert none == model_flops_per_token(m, 4096) < selective < full < 4 / 3 * none
    # 8 GPUs at 989 TFLOP/s, 400k tokens/s on 8B model FLOPs
    assert mfu(400_000, none, 8, 989) == pytest.approx(400_000 * none / (8 * 989e12))


@pytest.mark.parametrize(
    ("overrides", "kv_bytes"),
    [
        (["model=llama3_8b", "serve.tp=8", "serve.dtype=bfloat16"], 32 * 2 * 1 * 128 * 2),
        (["model=llama3_8b", "serve.tp=1", "serve.dtype=bfloat16"], 32 * 2 * 8 * 128 * 2),  # 128 KiB, vLLM's figure
        (["model=llama3_8b", "serve.tp=16", "serve.dtype=bfloat16"], 32 * 2 * 1 * 128 * 2),  # kv heads replicated
        (["model=llama3_70b", "serve.tp=8", "serve.kv_cache_dtype=fp8"], 80 * 2 * 1 * 128 * 1),
        (["model=deepseek_v3", "serve.tp=8", "serve.dtype=bfloat16"], 61 * (512 + 64) * 2),  # MLA latent, every rank
        (["model=deepseek_v3", "serve.tp=8", "serve.pp=2", "serve.dtype=bfloat16"], 31 * (512 + 64) * 2),
    ],
)
def test_kv_cache_bytes_per_token(overrides: list[str], kv_bytes: int) -> None:
    assert kv_bytes_per_token(spec_of("hardware=h100_80g", *overrides)) == kv_bytes


def test_serving_tokens_and_sequences() -> None:
    spec = spec_of("model=llama3_8b", "hardware=h100_80g", "serve.tp=1", "serve.max_model_len=8192")
    s = estimate_serve_memory(spec)
    assert s.weights_bytes_per_gpu == count_params(spec.model).total * 2
    # vLLM requests 0.9 of what mem_get_info reports (79.19 GiB on an H100 80GB), not of the label.
    assert s.requested_bytes == math.ceil(0.9 * 79.19 * 2**30)
    budget = s.requested_bytes - s.weights_bytes_per_gpu - s.activation_reserve_bytes
    assert s.max_tokens_in_cache == budget // (128 * 1024) // 16 * 16
    assert s.max_concurrent_seqs == s.max_tokens_in_cache // 8192
