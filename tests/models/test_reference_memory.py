"""lmspec's memory numbers against published references: the ZeRO paper, DeepSpeed's own
estimators (imported and run here), Megatron's bytes per parameter, Korthikanti et al. Table 2."""

from __future__ import annotations

import pytest

from lmspec.compiler.models.activations import ActivationSetting, LayerShape, layer_activation_bytes
from lmspec.compiler.models.params import count_params
from lmspec.compiler.models.train_memory import estimate_train_memory, state_bytes, zero_state_bytes
from lmspec.compiler.models.units import GB

from .conftest import spec_of


@pytest.mark.parametrize(("stage", "paper_gb"), [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.9)])
def test_zero_paper_figure_1(stage: int, paper_gb: float) -> None:
    """Rajbhandari et al. 2020, Figure 1: 7.5B parameters, 64 GPUs, Adam (K=12), fp16 params and grads."""
    per_param = zero_state_bytes(stage, 64, param_bytes=2, grad_bytes=2, fp32_grad_bytes=0, optimizer_bytes=12)
    total = 7.5e9 * (per_param.weights + per_param.gradients + per_param.optimizer)
    assert round(total / GB, 1) == paper_gb


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
def test_zero2_matches_deepspeeds_estimator(model: str, nodes: int, gpus: int) -> None:
    stage2 = pytest.importorskip("deepspeed.runtime.zero.stage_1_and_2")
    spec = spec_of(*_deepspeed_backend(model, 2, nodes, gpus))
    total = count_params(spec.model).total
    _, ds_gpu = stage2.estimate_zero2_model_states_mem_needs(total, gpus, nodes, cpu_offload=False)
    b = state_bytes(spec, nodes * gpus)
    assert int(total * (b.weights + b.gradients + b.optimizer)) == pytest.approx(ds_gpu, abs=2)
    _, ds_offload_gpu = stage2.estimate_zero2_model_states_mem_needs(total, gpus, nodes, cpu_offload=True)
    off = state_bytes(
        spec_of(*_deepspeed_backend(model, 2, nodes, gpus), "parallel.offload_optimizer=true"), nodes * gpus
    )
    assert total * (off.weights + off.gradients + off.optimizer) == ds_offload_gpu


@pytest.mark.parametrize(("model", "nodes", "gpus"), DS_CASES)
def test_zero3_matches_deepspeeds_estimator(model: str, nodes: int, gpus: int) -> None:
    stage3 = pytest.importorskip("deepspeed.runtime.zero.stage3")
    spec = spec_of(*_deepspeed_backend(model, 3, nodes, gpus))
    counts = count_params(spec.model)
    _, ds_gpu, _ = stage3.estimate_zero3_model_states_mem_needs(
        counts.total, counts.largest_layer, gpus, nodes, cpu_offload=False, cpu_offload_params=False
    )
    memory = estimate_train_memory(spec)
    assert memory is not None
    gpu = memory.worst
    gathered = 4 * counts.largest_layer  # 16-bit weights + gradients of the module being computed
    model_states = gpu.weights_bytes + gpu.gradients_bytes + gpu.optimizer_bytes + gathered
    assert model_states == pytest.approx(ds_gpu, abs=2)


def test_deepspeed_doc_t5_3b_zero3() -> None:
    """DeepSpeed's memory docs: t5-3b (2851M params, largest layer 32M), 8 GPUs: 6.09 GiB per GPU."""
    b = zero_state_bytes(3, 8, param_bytes=2, grad_bytes=2, fp32_grad_bytes=4, optimizer_bytes=12)
    per_gpu = 2851e6 * (b.weights + b.gradients + b.optimizer) + 4 * 32e6
    assert round(per_gpu / 2**30, 2) == 6.09


def test_zero3_with_the_real_model_side_by_side() -> None:
    """DeepSpeed's `_all_live` estimator reads the model itself: feed it the tiny model built in torch."""
    torch = pytest.importorskip("torch")
    stage3 = pytest.importorskip("deepspeed.runtime.zero.stage3")
    from .conftest import hf_model

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
    b = state_bytes(spec, dp)
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
