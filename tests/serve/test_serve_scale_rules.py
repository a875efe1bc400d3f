"""Golden messages of serving at scale (compiler/rules/serve_scale.py, compiler/rules/vllm_extra.py): EPLB,
the expert all-to-all, MTP speculative decoding, disaggregated pools and serve.extra_args, each naming the
key, its value and origin, and the fix. serve.extra_args is judged by vLLM's own parser where it is installed."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.marks import needs_vllm

from lmspec.compiler import vllm_args
from lmspec.compiler.emit.serve import vllm_options
from lmspec.compiler.pipeline import make_plan
from lmspec.compiler.rules.vllm_extra import BUILD_DECIDES, OPTION_KEYS
from lmspec.compiler.vllm_args import config_words, yaml_entry

DS = ["--spec", "deepseek_v3_serve_16gpu_h100_fp8"]  # tp 1 x dp 16 over 2 nodes, expert parallel
EPLB = "serve.eplb={num_redundant_experts:32,window_size:1000,step_interval:3000}"
MTP = "serve.speculative={method:mtp,num_tokens:1,acceptance_rate:0.8}"
POOLS = "serve.disaggregation={kv_connector:NixlConnector,prefill:{tp:8,dp:1,engines:1},decode:{tp:1,dp:8,engines:1}}"
SERVE_ONLY_CPU = [
    "train=null",
    "parallel=null",
    "convert=null",
    "serve.model_path=/models/tiny",
    "serve.max_model_len=128",
]

ERRORS = [
    pytest.param(
        [*DS, "serve.expert_parallel=false", "serve.all2all_backend=deepep_low_latency", EPLB],
        [
            "error: serve.eplb balances the experts over expert-parallel ranks, but serve.expert_parallel=false "
            "(command-line override); set serve.expert_parallel=true, or serve.eplb=null",
            'error: serve.all2all_backend="deepep_low_latency" (command-line override) is the expert all-to-all, '
            "used only with expert parallel",
        ],
        id="eplb-all2all-without-ep",
    ),
    pytest.param(
        [*DS, EPLB.replace(":32", ":30")],
        [
            "error: vLLM places experts evenly: model.moe.num_experts(256) + serve.eplb.num_redundant_experts(30) = "
            "286 is not a multiple of the 16 expert-parallel ranks (serve.tp(1) x serve.dp(16) = 16); valid: "
            "serve.eplb.num_redundant_experts=0, serve.eplb.num_redundant_experts=16",
        ],
        id="eplb-uneven",
    ),
    pytest.param(
        [*SERVE_ONLY_CPU, "serve.eplb={num_redundant_experts:0,window_size:1,step_interval:1}"],
        ["error: serve.eplb balances experts, but the model has none (model.moe=null (lmspec:specs/model/tiny.yaml"],
        id="eplb-dense",
    ),
    pytest.param(
        [*SERVE_ONLY_CPU, MTP],
        [
            "error: serve.speculative.method=mtp drafts with the model's multi-token-prediction modules, but "
            "model.mtp_layers=0 (lmspec:specs/model/tiny.yaml",
            "set serve.speculative=null, or serve a model that has them (DeepSeek-V3: model.mtp_layers=1)",
        ],
        id="mtp-without-modules",
    ),
    pytest.param(
        [*DS, "model.mtp_layers=2", MTP.replace("num_tokens:1", "num_tokens:3")],
        [
            "error: serve.speculative.num_tokens=3 (command-line override) is more than model.mtp_layers=2 "
            "(command-line override) and not a multiple of it: vLLM runs the MTP modules in turn; valid: 1, 2, 4, 6"
        ],
        id="mtp-tokens",
    ),
    pytest.param(
        [*DS, POOLS.replace("tp:8,dp:1,engines:1", "tp:6,dp:1,engines:2").replace("tp:1,dp:8", "tp:8,dp:2")],
        [
            "error: serve.disaggregation.prefill.tp=6 (command-line override) does not divide "
            "model.num_attention_heads=128",
            "error: a decode engine's serve.disaggregation.decode.tp(8) x serve.disaggregation.decode.dp(2) = 16 GPUs "
            "exceeds a node's hardware.gpus_per_node=8",
            "error: the pools need serve.disaggregation.prefill.engines(2) + serve.disaggregation.decode.engines(1) = "
            "3 nodes (an engine per node), but hardware.nodes=2 (lmspec:specs/deepseek_v3_serve_16gpu_h100_fp8.yaml",
            "use fewer engines, or hardware.nodes=3",
        ],
        id="pools",
    ),
    pytest.param(
        [*SERVE_ONLY_CPU, POOLS.replace("tp:8", "tp:1").replace("dp:8", "dp:1")],
        ["moves KV caches between GPUs (NIXL/UCX, RDMA)", "set serve.disaggregation=null on the cpu hardware"],
        id="pools-cpu",
    ),
]


@pytest.mark.parametrize(("overrides", "expected"), ERRORS)
def test_scale_errors_name_the_key_and_the_fix(overrides: list[str], expected: list[str], lmspec) -> None:
    result = lmspec("check", *overrides)
    assert result.code == 1, result.err
    for text in expected:
        assert text in result.err
    assert "Traceback" not in result.err


def test_all2all_without_data_parallel_warns_that_vllm_ignores_it(lmspec) -> None:
    result = lmspec("check", *DS, "serve.tp=8", "serve.dp=2", "serve.all2all_backend=deepep_low_latency")
    assert result.code == 0, result.err
    assert "serve.all2all_backend" not in result.err
    result = lmspec("check", *DS, "serve.tp=8", "serve.dp=1", "hardware.nodes=1", "serve.all2all_backend=nixl_ep")
    assert (
        'warning: serve.all2all_backend="nixl_ep" (command-line override) has no effect with serve.dp=1' in result.err
    )


@needs_vllm
@pytest.mark.parametrize(
    ("override", "expected"),
    [
        pytest.param(
            "+serve.extra_args.enable-chunkd-prefill=true",
            "`vllm serve` has no option --enable-chunkd-prefill; did you mean enable-chunked-prefill",
            id="unknown-name",
        ),
        pytest.param(
            "+serve.extra_args.long-prefill-token-threshold=x",
            "vLLM refuses it: argument --long-prefill-token-threshold: invalid int value: 'x'",
            id="bad-value",
        ),
        pytest.param(
            "+serve.extra_args.compilation-config={level:[1]}",
            "vLLM refuses it: argument --compilation-config/-cc: 1 validation error for CompilationConfig",
            id="bad-config-field",
        ),
        pytest.param(
            "+serve.extra_args.tensor-parallel-size=2",
            "lmspec writes --tensor-parallel-size itself: set serve.tp instead",
            id="owned",
        ),
        pytest.param(
            "+serve.extra_args.headless=true",
            "lmspec writes --headless itself: set serve.multi_node instead",
            id="owned-role-flag",
        ),
        pytest.param("+serve.extra_args.Max_Num=1", "lower case with dashes (max-num)", id="form"),
        pytest.param("+serve.extra_args.seed=null", "remove serve.extra_args.seed for vLLM's default", id="null"),
    ],
)
def test_extra_args_are_judged_by_vllms_parser(override: str, expected: str, lmspec) -> None:
    result = lmspec("check", *DS, override)
    assert result.code == 1, result.err
    key = override.lstrip("+").partition("=")[0]
    assert f"error: {key}=" in result.err and "(command-line override)" in result.err
    assert expected in result.err and "Traceback" not in result.err


@needs_vllm
def test_extra_args_vllm_takes_are_written_last_into_vllm_yaml() -> None:
    plan = make_plan(
        ["+serve.extra_args.enable-chunked-prefill=false", "+serve.extra_args.hf-overrides={rope_theta:1000}"],
        None,
    )
    assert all(p.key != "serve.extra_args" for p in plan.warnings)
    # false as no-NAME: true, the one spelling `vllm serve --config` does not drop
    assert vllm_options(plan)[-2:] == [("no-enable-chunked-prefill", True), ("hf-overrides", {"rope_theta": 1000})]


def test_without_vllm_the_rule_says_it_could_not_check(lmspec, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vllm_args, "serve_parser", lambda: None)
    monkeypatch.setattr("lmspec.compiler.rules.vllm_extra.serve_parser", lambda: None)
    result = lmspec("check", *DS, "+serve.extra_args.enable-chunked-prefill=true", "+serve.extra_args.port=1")
    assert result.code == 1, result.err
    assert "serve.extra_args.port=1 (command-line override): lmspec writes --port itself: set serve.port" in result.err
    assert (
        "warning: serve.extra_args holds enable-chunked-prefill, but vLLM is not installed here, so its parser "
        "could not check them" in result.err
    )


@needs_vllm
def test_every_option_lmspec_writes_is_one_extra_args_refuses() -> None:
    """The owned table covers every option vllm_options writes, so an extra arg can never repeat one."""
    parser = vllm_args.serve_parser()
    assert parser is not None
    plan = make_plan([EPLB, MTP, POOLS, "serve.all2all_backend=deepep_low_latency"], Path(DS[1]))
    written = {name for pool in (None, "prefill") for name, _ in vllm_options(plan, pool)}
    for name in written:
        dest = parser._option_string_actions[f"--{name}"].dest
        assert dest in OPTION_KEYS or dest in BUILD_DECIDES, name


def test_config_words_expand_as_vllms_config_file() -> None:
    assert config_words("x", True) == ["--x"] and config_words("x", False) is None and config_words("x", []) is None
    assert config_words(*yaml_entry("x", False)) == ["--no-x"]
    assert config_words("x", (1, "a")) == ["--x", "1", "a"]
    assert config_words("x", {"a": 1}) == ["--x", '{"a": 1}'] and config_words("x", 0.5) == ["--x", "0.5"]
