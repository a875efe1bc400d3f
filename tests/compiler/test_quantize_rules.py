"""The quantize group compiled: its presets on the default tiny job, and each rule's golden message (the key,
its value and origin, why, the fix), the kept modules by each family's own names, and the review surface."""

from __future__ import annotations

import pytest
from helpers.specs import spec_of

from lmspec.compiler.emit.report import emit_report
from lmspec.compiler.errors import SpecError
from lmspec.compiler.paths import SPECS_DIR
from lmspec.compiler.pipeline import make_plan
from lmspec.compiler.quantize_modules import default_kept, expert_patterns, kept_modules, linear_modules, matches

# vLLM loads the checkpoint as compressed-tensors; on the CPU preset (float32) its 4-bit kernel needs bfloat16
SERVED = ["serve.quantization=compressed-tensors", "serve.dtype=bfloat16"]
PRESETS = sorted(p.stem for p in (SPECS_DIR / "quantize").glob("*.yaml"))
CPU_SERVABLE = [p for p in PRESETS if p != "fp8"]  # static FP8 has no CPU kernel (rule below)
KEEP_MOE = 'quantize.keep=["lm_head","re:.*mlp[.]gate$","re:.*mlp[.]experts[.].*"]'


def test_the_five_presets_ship() -> None:
    assert PRESETS == ["fp8", "fp8_dynamic", "int8_smoothquant", "w4a16_awq", "w4a16_gptq"]


@pytest.mark.parametrize("preset", CPU_SERVABLE)
def test_preset_compiles_on_the_default_tiny_job_and_serves_its_output(preset: str) -> None:
    plan = make_plan([f"quantize={preset}", *SERVED])
    assert plan.spec.quantize is not None
    assert plan.served().model_dir == f"runs/tiny/hf-{preset}" == plan.spec.quantize.output
    assert plan.spec.quantize.calibration.seq_length == plan.trained().spec.train.seq_length
    assert not [w for w in plan.warnings if w.key.startswith("quantize")]


def test_a_preset_key_is_overridden_and_the_default_is_no_quantization() -> None:
    assert make_plan([]).spec.quantize is None
    plan = make_plan(["quantize=w4a16_gptq", "quantize.method=awq", *SERVED])
    assert plan.spec.quantize is not None and plan.spec.quantize.method == "awq"
    assert plan.origins.of("quantize.method") == "command-line override"


def test_a_spec_file_without_the_group_reads_it_as_null() -> None:
    preset = SPECS_DIR / "tiny_moe_pretrain_2rank_cpu_fp32.yaml"
    assert "quantize" not in preset.read_text(encoding="utf-8")
    assert make_plan([], preset).spec.quantize is None


ERRORS = [
    pytest.param(
        ["quantize=w4a16_gptq", *SERVED, "convert=null"],
        "quantize",
        [
            "quantize (w4a16 by gptq, from ",
            "but convert=null (command-line override): quantize needs a converted checkpoint",
            "set quantize=null, or train=default and convert=default",
        ],
        id="no-conversion",
    ),
    pytest.param(
        ["quantize=w4a16_gptq"],
        "serve.quantization",
        [
            "serve.quantization=null (lmspec:specs/serve/default.yaml:",
            "vLLM loads llm-compressor's checkpoint by its compressed-tensors config",
            "set serve.quantization=compressed-tensors",
        ],
        id="serve-quantization",
    ),
    pytest.param(
        ["quantize=w4a16_gptq", *SERVED, "serve.model_path=models/other"],
        "serve.model_path",
        [
            'serve.model_path="models/other" (command-line override)',
            'the serve stage serves the quantized checkpoint (quantize.output="runs/tiny/hf-w4a16_gptq"',
            "set serve.model_path=null, or quantize=null to serve models/other",
        ],
        id="model-path",
    ),
    pytest.param(
        [*SERVED],
        "serve.quantization",
        [
            'serve.quantization="compressed-tensors" (command-line override) but quantize=null (default)',
            "nothing calibrated it",
            "set quantize=w4a16_gptq (or another preset of specs/quantize/)",
        ],
        id="nothing-calibrated",
    ),
    pytest.param(
        ["quantize=fp8_dynamic", *SERVED, "quantize.method=awq"],
        "quantize.method",
        ['quantize.method="awq" (command-line override) with quantize.scheme="fp8_dynamic"', "quantize.scheme=w4a16"],
        id="awq-needs-w4a16",
    ),
    pytest.param(
        ["quantize=w4a16_gptq", *SERVED, "quantize.smoothquant_strength=0.5"],
        "quantize.smoothquant_strength",
        ["quantize.smoothquant_strength=0.5 (command-line override)", "set quantize.smoothquant_strength=null"],
        id="smoothquant-needs-int8",
    ),
    pytest.param(
        ["quantize=int8_smoothquant", *SERVED, "quantize.group_size=128"],
        "quantize.group_size",
        ["the 8-bit schemes keep one scale per output channel", "set quantize.group_size=null"],
        id="group-needs-w4a16",
    ),
    pytest.param(
        ["quantize=w4a16_gptq", *SERVED, "quantize.group_size=256"],
        "quantize.group_size",
        ["vLLM's W4A16 kernels (Marlin, Machete) take groups of 32, 64, 128", "quantize.group_size=32 or 64 or 128"],
        id="group-vllm-sizes",
    ),
    pytest.param(
        ["quantize=w4a16_gptq", *SERVED, "model.ffn_hidden_size=544"],
        "quantize.group_size",
        [
            "quantize.group_size=128 (lmspec:specs/quantize/w4a16_gptq.yaml:",
            "does not divide model.ffn_hidden_size = 544, the input of model.layers.0.mlp.down_proj",
            "use quantize.group_size=32, or quantize.group_size=null",
        ],
        id="group-divides-dimension",
    ),
    pytest.param(
        ["model=tiny_moe", "quantize=w4a16_gptq", *SERVED, "quantize.group_size=64", "serve.tp=2"],
        "quantize.group_size",
        [
            "does not divide the 32 inputs of model.layers.1.mlp.shared_experts.down_proj each of serve.tp=2",
            "vLLM's kernels need whole groups on every rank",
        ],
        id="group-divides-tp-share",
    ),
    pytest.param(
        ["model=tiny_moe", "quantize=w4a16_gptq", *SERVED, "quantize.group_size=32", "quantize.keep=[]"],
        "quantize.keep",
        [
            "quantize.keep=[] (command-line override) leaves the output head",
            "and a MoE router",
            """add 'lm_head' and 're:.*mlp[.]gate$': quantize.keep='["lm_head","re:.*mlp[.]gate$"]'""",
        ],
        id="keep-head-and-routers",
    ),
    pytest.param(
        ["quantize=w4a16_gptq", *SERVED, 'quantize.keep=["lm_head","model.layers.0.mlp.gate_proj"]'],
        "quantize.keep",
        [
            "keeps model.layers.0.mlp.gate_proj but not model.layers.0.mlp.up_proj: vLLM fuses them",
            "keep all of them or none",
        ],
        id="keep-fused-whole",
    ),
    pytest.param(
        ["quantize=fp8", *SERVED],
        "quantize.scheme",
        [
            'quantize.scheme="fp8" (lmspec:specs/quantize/fp8.yaml:',
            "vLLM's CPU engine has no kernel for FP8 activations with static scales",
            "use quantize.scheme=fp8_dynamic (quantize=fp8_dynamic) or quantize.scheme=int8",
        ],
        id="cpu-static-fp8",
    ),
    pytest.param(
        ["quantize=w4a16_gptq", *SERVED, "quantize.calibration.seq_length=2048"],
        "quantize.calibration.seq_length",
        [
            "quantize.calibration.seq_length=2048 (command-line override) exceeds model.max_position_embeddings=1024",
            "use quantize.calibration.seq_length=128",
        ],
        id="calibration-positions",
    ),
]


@pytest.mark.parametrize(("overrides", "key", "expected"), ERRORS)
def test_quantize_error_names_key_origin_and_fix(lmspec, overrides: list[str], key: str, expected: list[str]) -> None:
    lmspec("check", *overrides).assert_reports(1, expected)
    with pytest.raises(SpecError) as caught:
        make_plan(overrides)
    assert key in {p.key for p in caught.value.problems if p.severity == "error"}


WARNINGS = [
    pytest.param(
        ["model=tiny_moe", "quantize=w4a16_gptq", *SERVED, "quantize.group_size=32"],
        [
            "quantize.keep=null (lmspec:specs/quantize/w4a16_gptq.yaml:",
            'quantizes the routed experts, served on hardware.name="cpu"',
            "only where the CPU has AMX tiles",
            """quantize.keep='["lm_head","re:.*mlp[.]gate$","re:.*mlp[.]experts[.].*"]'""",
        ],
        id="cpu-moe-amx",
    ),
    pytest.param(
        ["hardware=a100_80g", "train.seq_length=1024", "serve.tp=1", "quantize=fp8", *SERVED],
        [
            'quantize.scheme="fp8" (lmspec:specs/quantize/fp8.yaml:',
            'hardware.gpu.generation="ampere"',
            "the FLOP/s gain is lost",
        ],
        id="ampere-fp8",
    ),
    pytest.param(
        ["quantize=w4a16_gptq", *SERVED, "quantize.calibration.seq_length=256"],
        ["is longer than train.seq_length=128", "use quantize.calibration.seq_length=128"],
        id="calibration-past-training",
    ),
    pytest.param(
        ["quantize=w4a16_gptq", *SERVED, 'quantize.keep=["lm_head","re:.*no_such_module"]'],
        ["'re:.*no_such_module' matches no linear layer of model.family=\"llama\"", "fix the name, or drop it"],
        id="keep-matches-nothing",
    ),
]


@pytest.mark.parametrize(("overrides", "expected"), WARNINGS)
def test_quantize_warning_does_not_fail(lmspec, overrides: list[str], expected: list[str]) -> None:
    result = lmspec("check", *overrides)
    assert result.code == 0, result.err
    for fragment in expected:
        assert fragment in result.err, result.err


def test_keeping_the_experts_clears_the_cpu_amx_warning() -> None:
    plan = make_plan(["model=tiny_moe", "quantize=w4a16_gptq", *SERVED, "quantize.group_size=32", KEEP_MOE])
    assert not [w for w in plan.warnings if w.key == "quantize.keep"]


@pytest.mark.parametrize(
    ("model", "router", "expert"),
    [
        ("tiny", None, None),
        ("mixtral_8x7b", "model.layers.0.block_sparse_moe.gate", "model.layers.0.block_sparse_moe.experts.7.w2"),
        ("qwen3_30b_a3b", "model.layers.0.mlp.gate", "model.layers.0.mlp.experts.5.down_proj"),
        ("deepseek_v3", "model.layers.3.mlp.gate", "model.layers.3.mlp.experts.255.up_proj"),
    ],
)
def test_default_keep_is_the_head_and_the_family_s_routers(model: str, router: str | None, expert: str | None) -> None:
    spec = spec_of(f"model={model}", "quantize=w4a16_gptq")
    kept = kept_modules(spec)
    assert kept == default_kept(spec.model) and kept[0] == "lm_head"
    names = [name for linear in linear_modules(spec.model) for name in linear.names]
    assert not any(matches(p, n) for p in kept[1:] for n in names if not n.endswith(".gate"))  # routers only
    if router is None:
        assert kept == ("lm_head",) and expert_patterns(spec.model) == ()
        return
    assert router in names and any(matches(p, router) for p in kept)
    assert expert is not None and any(matches(p, expert) for p in expert_patterns(spec.model))
    assert not any(matches(p, "model.layers.3.self_attn.o_proj") for p in expert_patterns(spec.model))


def test_quantize_output_is_checked_against_the_converted_model_and_checkpoints(lmspec) -> None:
    lmspec("check", "quantize=w4a16_gptq", *SERVED, "quantize.output=runs/tiny/hf").assert_reports(
        1,
        [
            'quantize.output="runs/tiny/hf" (command-line override) is the same directory as convert.output=',
            "the converted model it calibrates",
        ],
    )
    lmspec("check", "quantize=w4a16_gptq", *SERVED, "quantize.output=runs/tiny/checkpoints/q").assert_reports(
        1, ["is inside train.checkpoint.dir=", "would write among the checkpoints"]
    )


def test_report_and_explain_show_what_is_quantized(lmspec) -> None:
    plan = make_plan(["model=tiny_moe", "quantize=int8_smoothquant", *SERVED, KEEP_MOE])
    (report,) = emit_report(plan).values()
    section = report.split("## Quantization (llm-compressor)")[1].split("## Serving")[0]
    assert "INT8 (W8A8)" in section and "SmoothQuant 0.8 first" in section
    assert "`re:.*mlp[.]experts[.].*` (quantize.keep)" in section and "routed experts 0.0%" in section
    assert "512 sequences of 128 tokens from the validation split of train.data" in section
    assert "at most 2.0% (quantize.max_perplexity_increase)" in section
    assert "`runs/tiny_moe/hf-int8_smoothquant`" in section
    assert "the quantize stage's int8 checkpoint, calibrated from the conversion output" in report
    assert "## Quantization" not in next(iter(emit_report(make_plan([])).values()))
    result = lmspec("explain", "quantize=w4a16_gptq", *SERVED)
    assert result.code == 0, result.err
    assert "quantize.group_size" in result.out and "quantize.kept" in result.out
    assert '["lm_head"]' in result.out
