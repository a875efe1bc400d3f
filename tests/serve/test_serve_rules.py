"""Golden messages of the serving rules: the key, its value and origin, every factor, the fix."""

from __future__ import annotations

import pytest

ERRORS = [
    pytest.param(
        [
            "model.num_attention_heads=12",
            "model.num_kv_heads=4",
            "model.hidden_size=384",
            "hardware.gpus_per_node=6",
            "train.global_batch_size=24",
            "serve.tp=6",
        ],
        [
            "serve.tp=6 (command-line override) neither divides nor is a multiple of model.num_kv_heads=4",
            "valid: 1, 2, 4, 12",
        ],
        id="kv-heads",
    ),
    pytest.param(
        ["serve.pp=2", "serve.dp=2"],
        [
            "serving needs serve.tp(1) x serve.pp(2) x serve.dp(2) = 4 GPUs",
            "hardware.gpus_per_node(2) x hardware.nodes(1) = 2 are available",
            "serve.tp from ",
            "specs/hardware/cpu.yaml:",
            "serve.dp from command-line override",
            "raise hardware.nodes",
        ],
        id="gpus",
    ),
    pytest.param(
        ["serve.pp=5", "hardware.gpus_per_node=5", "train.global_batch_size=20"],
        ["serve.pp=5 (command-line override) exceeds model.num_layers=4", "use serve.pp<=4"],
        id="pp-layers",
    ),
    pytest.param(
        ["serve.quantization=gptq"],
        [
            'serve.quantization="gptq" (command-line override) needs a checkpoint calibrated for GPTQ',
            'convert.output="runs/tiny/hf" (',
            "specs/convert/default.yaml:",
            "set serve.model_path",
            "serve.quantization=fp8",
        ],
        id="calibration",
    ),
    pytest.param(
        ["serve.expert_parallel=true"],
        ["serve.expert_parallel=true (command-line override) needs a MoE model", "set serve.expert_parallel=false"],
        id="ep-needs-moe",
    ),
    pytest.param(
        ["serve.cpu_kvcache_space_gib=1.5"],
        [
            "serve.cpu_kvcache_space_gib=1.5 (command-line override) is not a whole number",
            "use serve.cpu_kvcache_space_gib=2",
        ],
        id="cpu-kv-gib",
    ),
    pytest.param(
        ["serve.gpu_memory_utilization=1.5"],
        ["serve.gpu_memory_utilization=1.5 (command-line override)"],
        id="utilization-range",
    ),
    pytest.param(
        ["serve.gpu_memory_utilization=0"],
        ["serve.gpu_memory_utilization=0 (command-line override)"],
        id="utilization-zero",
    ),
]

WARNINGS = [
    pytest.param(
        ["serve.max_model_len=64"],
        [
            "serve.max_model_len=64 (command-line override) is shorter than train.seq_length=128",
            "serve.max_model_len=128 serves them",
        ],
        id="shorter-than-training",
    ),
    pytest.param(
        ["--spec", "llama3_8b_pretrain_8gpu_h100_bf16", "serve.gpu_memory_utilization=0.98"],
        ["serve.gpu_memory_utilization=0.98 (command-line override) leaves under 5%"],
        id="headroom",
    ),
    pytest.param(
        ["--spec", "llama3_8b_pretrain_8gpu_h100_bf16", "hardware.nodes=2", "serve.tp=16"],
        [
            "serve.tp=16 (command-line override) exceeds hardware.gpus_per_node=8",
            "use serve.tp=8 with serve.pp across nodes",
        ],
        id="tp-across-nodes",
    ),
]


@pytest.mark.parametrize(("overrides", "expected"), ERRORS)
def test_serving_error_names_key_origin_and_fix(lmspec, overrides: list[str], expected: list[str]) -> None:
    result = lmspec("check", *overrides)
    result.assert_reports(1, expected)


@pytest.mark.parametrize(("overrides", "expected"), WARNINGS)
def test_serving_warning_does_not_fail(lmspec, overrides: list[str], expected: list[str]) -> None:
    result = lmspec("check", *overrides)
    assert result.code == 0, result.err
    assert f"warning: {expected[0]}" in result.err, result.err
    for fragment in expected[1:]:
        assert fragment in result.err, result.err


def test_cpu_serving_has_no_gpu_headroom_warning(lmspec) -> None:
    result = lmspec("check", "serve.gpu_memory_utilization=1.0")
    assert result.code == 0 and "gpu_memory_utilization" not in result.err
