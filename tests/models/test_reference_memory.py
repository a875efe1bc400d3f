"""lmspec's memory numbers against published references: DeepSpeed's own estimators (imported and run here,
and where lmspec prices what DeepSpeed allocates instead, by how much), Megatron's bytes per parameter,
Korthikanti et al. Table 2."""

from __future__ import annotations

import pytest
from helpers.specs import spec_of

from lmspec.compiler.models.activations import ActivationSetting, LayerShape, layer_activation_bytes
from lmspec.compiler.models.params import count_params
from lmspec.compiler.models.train_memory import state_bytes


def _deepspeed_backend(model: str, zero_stage: int, nodes: int, gpus: int) -> list[str]:
    return [
        f"model={model}",
        "train.backend=deepspeed",
        "train.precision=bf16",
        f"parallel.zero_stage={zero_stage}",
        f"hardware.nodes={nodes}",
        f"hardware.gpus_per_node={gpus}",
    ]


DS_CASES = [
    ("tiny", 1, 2),
    ("llama3_8b", 1, 8),
    ("llama3_70b", 8, 8),
    ("mixtral_8x7b", 4, 8),
    ("deepseek_v2_lite", 2, 8),
]


@pytest.mark.parametrize(("model", "nodes", "gpus"), DS_CASES)
def test_zero2_against_deepspeeds_estimator(model: str, nodes: int, gpus: int) -> None:
    """DeepSpeed's estimator counts 2 + 18/d B/param: an fp32 gradient partition (4/d) that ZeRO-2 makes only
    inside the optimizer step. At the backward peak of an accumulating step it holds two 16-bit partitions
    instead (2 x 2/d: each micro-batch's reduce makes a new one while the last is referenced), 2/d less.
    Offloaded, both count the 16-bit weights alone."""
    stage2 = pytest.importorskip("deepspeed.runtime.zero.stage_1_and_2")
    spec = spec_of(*_deepspeed_backend(model, 2, nodes, gpus))
    total, d = count_params(spec.model).total, nodes * gpus
    for offload, less in ((False, 2 * total / d), (True, 0)):
        _, ds_gpu = stage2.estimate_zero2_model_states_mem_needs(total, gpus, nodes, cpu_offload=offload)
        flags = ["parallel.offload_optimizer=true"] if offload else []
        b = state_bytes(spec_of(*_deepspeed_backend(model, 2, nodes, gpus), *flags), d, 2)
        assert total * (b.weights + b.gradients + b.optimizer) == pytest.approx(ds_gpu - less, abs=2)


@pytest.mark.parametrize(("precision", "per_param"), [("bf16", 2 + 2 + 4 + 8), ("fp32", 4 + 4 + 4 + 8)])
def test_zero3_partitions(precision: str, per_param: int) -> None:
    """ZeRO-3 keeps five partitions: parameters and gradients in the model's dtype, fp32 master weights and
    Adam's two moments (DeepSpeed clones the master even in fp32; measured on CPU, five 4-byte partitions)."""
    spec = spec_of(*_deepspeed_backend("llama3_8b", 3, 8, 8), f"train.precision={precision}")
    b = state_bytes(spec, 64, 4)
    assert b.weights + b.gradients + b.optimizer == pytest.approx(per_param / 64)


def test_zero3_with_the_real_model_side_by_side() -> None:
    """DeepSpeed's `_all_live` estimator reads the model itself: feed it the tiny model built in torch."""
    torch = pytest.importorskip("torch")
    stage3 = pytest.importorskip("deepspeed.runtime.zero.stage3")
    from helpers.hf import hf_model

    spec = spec_of(*_deepspeed_backend("tiny", 3, 1, 2))
    model = hf_model(spec.model, device="cpu")
    total, largest = stage3.model_to_params(model)
    counts = count_params(spec.model)
    assert (total, largest) == (counts.total, counts.largest_layer)
    del torch


@pytest.mark.parametrize(
    ("dp", "distributed_optimizer", "bytes_per_param"),
    [(8, False, 18.0), (8, True, 6 + 12 / 8), (64, True, 6 + 12 / 64)],
)
def test_megatron_bytes_per_parameter(dp: int, distributed_optimizer: bool, bytes_per_param: float) -> None:
    spec = spec_of("model=llama3_8b", "hardware=h100_80g", f"parallel.distributed_optimizer={distributed_optimizer}")
    b = state_bytes(spec, dp, 8)
    assert b.weights + b.gradients + b.optimizer == pytest.approx(bytes_per_param)


# GPT-3 175B in Korthikanti et al. 2022: s=2048, b=1, h=12288, a=96, t=8; LayerNorm, GeLU 4h MLP,
# dropout after attention, MLP and softmax; 16-bit activations, 1-byte dropout masks.
S, B, H, A, T = 2048, 1, 12288, 96, 8
GPT3 = LayerShape(hidden=H, heads=A, q_width=H, k_width=H, v_width=H, out_width=H, ffn=4 * H, gated=False, dropout=True)
SBH = S * B * H
TABLE_2 = [
    pytest.param(1, False, "none", SBH * (34 + 5 * A * S / H), id="no-parallelism"),
    pytest.param(T, False, "none", SBH * (10 + 24 / T + 5 * A * S / (H * T)), id="tensor-parallel"),
    pytest.param(T, True, "none", SBH / T * (34 + 5 * A * S / H), id="tensor+sequence-parallel"),
    pytest.param(T, False, "selective", SBH * (10 + 24 / T), id="tensor-parallel+selective"),
    pytest.param(T, True, "selective", SBH * 34 / T, id="tensor+sequence-parallel+selective"),
    pytest.param(T, False, "full", SBH * 2, id="full-recompute"),
]


@pytest.mark.parametrize(("tp", "sp", "recompute", "paper_bytes"), TABLE_2)
def test_korthikanti_table_2_gpt3_175b(tp: int, sp: bool, recompute: str, paper_bytes: float) -> None:
    setting = ActivationSetting(
        style="megatron",
        seq_length=S,
        micro_batch_size=B,
        element_bytes=2,
        tp=tp,
        sequence_parallel=sp,
        recompute=recompute,
        flash_attention=False,
    )  # type: ignore[arg-type]
    assert layer_activation_bytes(GPT3, setting) == pytest.approx(paper_bytes, rel=1e-12)


def test_flash_attention_drops_the_score_term() -> None:
    eager = ActivationSetting(
        style="megatron",
        seq_length=S,
        micro_batch_size=B,
        element_bytes=2,
        tp=T,
        sequence_parallel=True,
        flash_attention=False,
    )
    flash = ActivationSetting(
        style="megatron",
        seq_length=S,
        micro_batch_size=B,
        element_bytes=2,
        tp=T,
        sequence_parallel=True,
        flash_attention=True,
    )
    log_sum_exp = S * B * A / T * 4
    assert layer_activation_bytes(GPT3, flash) == pytest.approx(SBH * 34 / T + log_sum_exp)
    assert layer_activation_bytes(GPT3, eager) - layer_activation_bytes(GPT3, flash) == pytest.approx(
        SBH * 5 * A * S / (H * T) - log_sum_exp
    )
