"""Golden messages of the serving rules: the key, its value and origin, every factor, the fix."""

from __future__ import annotations

import pytest

# A serve-only job of the tiny model (its hardware is the engine's own).
SERVE_ONLY = ["train=null", "parallel=null", "convert=null", "serve.model_path=/models/tiny", "serve.max_model_len=128"]
LINEAR_ROPE = (
    "model.rope_scaling={type:linear,factor:2.0,original_max_position_embeddings:null,low_freq_factor:null,"
    "high_freq_factor:null,beta_fast:null,beta_slow:null,mscale:null,mscale_all_dim:null}"
)

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
            "lower serve.tp/pp/dp",
            "or serve=null (a train-only job: the hardware is sized for training",
        ],
        id="gpus",
    ),
    pytest.param(
        [*SERVE_ONLY, "serve.pp=2", "serve.dp=2", "serve.host=0.0.0.0"],
        ["serving needs serve.tp(1) x serve.pp(2) x serve.dp(2) = 4 GPUs", "or hardware.nodes=2"],
        id="gpus-serve-only",
    ),
    pytest.param(
        [*SERVE_ONLY, "hardware.gpus_per_node=1", "hardware.nodes=2", "serve.dp=2"],
        [
            'serve.host="127.0.0.1" (lmspec:specs/serve/default.yaml:',
            "is a loopback address, but the engine spans 2 nodes",
            "use serve.host=0.0.0.0 (or node 0's address)",
        ],
        id="loopback",
    ),
    pytest.param(
        [*SERVE_ONLY, "hardware.gpus_per_node=1", "hardware.nodes=2", "serve.dp=2", "serve.host=localhost"],
        ['serve.host="localhost" (command-line override) is a loopback address'],
        id="loopback-name",
    ),
    pytest.param(
        [*SERVE_ONLY, "hardware.gpus_per_node=1", "hardware.nodes=2", "serve.dp=2", "serve.host=::1"],
        ['serve.host="::1" (command-line override) is a loopback address'],
        id="loopback-v6",
    ),
    pytest.param(
        [
            *SERVE_ONLY,
            "hardware.gpus_per_node=2",
            "hardware.nodes=3",
            "serve.dp=3",
            "serve.multi_node=data_parallel",
            "serve.host=0.0.0.0",
        ],
        [
            'serve.multi_node="data_parallel" (command-line override) does not apply',
            "serve.dp=3 (command-line override) is not a multiple of the 2 ranks a node holds",
            "use serve.dp=2 or serve.dp=4, or serve.multi_node=ray",
        ],
        id="dp-uneven-nodes",
    ),
    pytest.param(
        [
            *SERVE_ONLY,
            "hardware.gpus_per_node=1",
            "hardware.nodes=2",
            "serve.tp=2",
            "serve.multi_node=data_parallel",
            "serve.host=0.0.0.0",
        ],
        [
            'serve.multi_node="data_parallel" (command-line override) does not apply',
            "a data-parallel rank's serve.tp x serve.pp = 2 GPUs exceeds a node's 1",
            "use serve.multi_node=ray",
        ],
        id="dp-rank-exceeds-node",
    ),
    pytest.param(
        [
            *SERVE_ONLY,
            "hardware.gpus_per_node=1",
            "hardware.nodes=2",
            "serve.dp=2",
            "serve.multi_node=mp",
            "serve.host=0.0.0.0",
        ],
        [
            'serve.multi_node="mp" (command-line override) does not apply',
            "serve.dp=2 (command-line override): lmspec runs one engine per `vllm serve --nnodes` deployment",
            "use serve.dp=1 (serve.replicas for copies), or serve.multi_node=ray, or serve.multi_node=data_parallel",
        ],
        id="mp-dp",
    ),
    pytest.param(
        [
            *SERVE_ONLY,
            "hardware.gpus_per_node=2",
            "hardware.nodes=2",
            "serve.tp=1",
            "serve.pp=3",
            "serve.multi_node=mp",
            "serve.host=0.0.0.0",
        ],
        [
            'serve.multi_node="mp" (command-line override) does not apply',
            "vLLM needs --nnodes 2 to divide the world size serve.tp x serve.pp = 1 x 3 = 3",
            "use serve.tp/pp whose product 2 divides, or serve.multi_node=ray (its last node may hold fewer)",
        ],
        id="mp-uneven-nodes",
    ),
    pytest.param(
        [LINEAR_ROPE, "serve.max_model_len=2049"],
        [
            "serve.max_model_len=2049 (command-line override) exceeds the 2,048 tokens vLLM derives from the model",
            "model.max_position_embeddings=1024 (lmspec:specs/model/tiny.yaml:",
            "x rope_scaling factor 2 (linear)",
            "use serve.max_model_len<=2048",
        ],
        id="len-vs-derived",
    ),
    pytest.param(
        ["model.head_dim=16"],
        [
            "model.head_dim=16 (command-line override): vLLM's CPU attention supports head_dim 32, 64, 80, 96",
            "the server would start and fail the first request",
        ],
        id="cpu-head-dim",
    ),
    pytest.param(
        ["model=deepseek_v2_lite", *SERVE_ONLY, "model.mla.kv_lora_rank=256"],
        [
            "model.mla.kv_lora_rank=256 (command-line override) + model.mla.qk_rope_head_dim=64",
            "vLLM's CPU MLA kernel supports only a latent of 576",
        ],
        id="cpu-mla-latent",
    ),
    pytest.param(
        ["model=deepseek_v2_lite", *SERVE_ONLY, "serve.kv_cache_dtype=fp8"],
        ['serve.kv_cache_dtype="fp8" (command-line override): vLLM\'s CPU MLA supports only an unquantized KV cache'],
        id="cpu-mla-kv-dtype",
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
        ["--spec", "llama3_8b_pretrain_8gpu_h100_bf16", "hardware.nodes=2", "serve.tp=16", "serve.host=0.0.0.0"],
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


def test_len_within_derived_length_passes(lmspec) -> None:
    result = lmspec("check", LINEAR_ROPE, "serve.max_model_len=2048")
    assert result.code == 0, result.err


@pytest.mark.parametrize(
    "overrides",
    [
        pytest.param(["serve.tp=1"], id="memory"),  # 70B in bf16 on one 80 GB GPU
        pytest.param(["serve.tp=8", "serve.dp=16", "serve.host=0.0.0.0"], id="gpus"),  # 128 of 64 GPUs
    ],
)
def test_train_and_serve_fixes_name_serve_keys_never_hardware(lmspec, overrides: list[str]) -> None:
    """The Llama-3-70B training preset's hardware is sized for training: serving that does not fit
    is fixed by serve keys, or by not serving (serve=null), never by hardware.*."""
    result = lmspec("check", "--spec", "llama3_70b_pretrain_64gpu_h100_bf16", *overrides)
    assert result.code == 1, result.err
    errors = [line for line in result.err.splitlines() if line.startswith("error: serv")]
    assert errors, result.err
    for line in errors:
        fixes = line.partition("Fixes: ")[2] or line.partition(" are available (")[2].partition("); ")[2]
        assert "serve=null" in fixes and "hardware." not in fixes, line
        assert "serve." in fixes, line


def test_cpu_mla_outside_deepseeks_latent_only_warns_on_a_training_job(lmspec) -> None:
    """tiny_moe (MLA latent 96) trains on CPU; only its serving cannot run there: a warning naming serve=null."""
    result = lmspec("check", "--spec", "tiny_moe_pretrain_2rank_cpu_fp32")
    assert result.code == 0, result.err
    assert "vLLM's CPU MLA kernel supports only a latent of 576" in result.err and "or serve=null" in result.err
