"""serve.multi_node=mp (vLLM's multiprocessing executor across nodes) as the layout, auto, REPORT.md and the
scripts see it, and Kimi-K2 served on its own: a serve-only spec is judged by the rules of serving, never by
megatron-core's (lmspec.compiler.families.family.Family.training_refusals), which still judge a spec that
trains the same model."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from helpers.build import compile_build
from helpers.paths import ROOT

from lmspec.compiler.build.files import SERVE_HEAD_SH, SERVE_WORKER_SH
from lmspec.compiler.pipeline import make_plan
from lmspec.compiler.spec.load import compose_spec

SERVE_ONLY = [
    "train=null",
    "parallel=null",
    "convert=null",
    "serve.model_path=/models/m",
    "serve.max_model_len=128",
    "serve.host=0.0.0.0",
]
LLAMA_70B = "llama3_70b_serve_8gpu_h100_bf16"
KIMI_CONFIG = ROOT / "tests" / "data" / "hf_configs_remote" / "Kimi-K2-Instruct.json"
# Kimi-K2-Instruct served as released: FP8 on one node of 8 x H200
KIMI_SERVE = [
    "model=kimi_k2",
    "train=null",
    "parallel=null",
    "convert=null",
    "hardware=h200_141g",
    "serve.model_path=/models/Kimi-K2-Instruct",
    "serve.tp=8",
    "serve.quantization=fp8",
    "serve.max_model_len=8192",  # 8 x H200 holds ~9,400 tokens a GPU beside the FP8 weights
]
# config.json's own spelling of Kimi's routing: one group of all 384 experts, which a token always uses
ONE_GROUP = ["model.moe.router_num_groups=1", "model.moe.router_group_topk=1"]
# groups that do limit routing: 8 groups, a token's experts from the best 2; megatron-core scores a group by its
# top 8 / 2 = 4 experts, transformers' and vLLM's DeepseekV3 by its top 2
LIMITING_GROUPS = ["model.moe.router_num_groups=8", "model.moe.router_group_topk=2"]


@pytest.mark.parametrize(
    ("spec", "overrides", "mode"),
    [
        # tp x pp across nodes, one engine, the same GPUs on every node: mp, no Ray
        pytest.param(LLAMA_70B, ["hardware.nodes=2", "serve.pp=2", "serve.host=0.0.0.0"], "mp", id="tp8-pp2"),
        pytest.param(None, [*SERVE_ONLY, "hardware.gpus_per_node=1", "hardware.nodes=2", "serve.tp=2"], "mp", id="tp2"),
        # each data-parallel rank fits a node: data parallel, as before
        pytest.param(
            None, [*SERVE_ONLY, "hardware.gpus_per_node=1", "hardware.nodes=2", "serve.dp=2"], "data_parallel", id="dp"
        ),
        # what mp cannot run stays on Ray: replicas of a multi-node engine, nodes holding different numbers of ranks
        pytest.param(
            LLAMA_70B,
            ["hardware.nodes=4", "serve.pp=2", "serve.dp=2", "serve.host=0.0.0.0"],
            "ray",
            id="dp2-of-tp8-pp2",
        ),
        pytest.param(
            None,
            [*SERVE_ONLY, "hardware.gpus_per_node=2", "hardware.nodes=2", "serve.tp=1", "serve.pp=3"],
            "ray",
            id="3-ranks-on-2-nodes",
        ),
    ],
)
def test_auto_picks_mp_where_it_applies(spec: str | None, overrides: list[str], mode: str) -> None:
    plan = make_plan(overrides, Path(spec) if spec else None)
    assert plan.served().layout.mode == mode


def test_mp_layout_puts_the_same_ranks_on_every_node_and_the_engine_on_node_0(tmp_path: Path) -> None:
    plan, build = compile_build(tmp_path, ["hardware.nodes=3", "serve.pp=3", "serve.host=0.0.0.0"], LLAMA_70B)
    layout = plan.served().layout
    assert (layout.mode, layout.nodes, layout.gpus, layout.spans_nodes) == ("mp", 3, 24, True)
    assert [(r.name, r.nodes, r.gpus_per_node) for r in layout.roles] == [("head", (0,), 8), ("worker", (1, 2), 8)]
    # one engine: its scheduler and KV cache are counted on node 0, the workers hold ranks only
    assert [r.dp_ranks_per_node for r in plan.served().numbers.roles] == [1, 0]
    report = (build / "REPORT.md").read_text()
    assert "tp 8 x pp 3 x dp 1 = 24 GPU(s) on 3 nodes (mp)" in report
    assert f"on node 0 `bash build/{plan.name}/{SERVE_HEAD_SH} HEAD_ADDRESS`" in report
    head, worker = (build / SERVE_HEAD_SH).read_text(), (build / SERVE_WORKER_SH).read_text()
    assert "vLLM's multiprocessing executor" in head and "HEAD_ADDRESS:29501" in head
    assert '--node-rank "$NODE_RANK"' in worker and "--headless" in worker


def test_the_kimi_k2_preset_is_its_released_config_json(lmspec, tmp_path: Path) -> None:
    """`lmspec import-model` of Kimi-K2-Instruct's config.json writes specs/model/kimi_k2.yaml's model."""
    out = tmp_path / "kimi_k2.yaml"
    assert lmspec("import-model", str(KIMI_CONFIG), "-o", str(out), "--name", "kimi_k2").code == 0
    assert yaml.safe_load(out.read_text()) == compose_spec(["model=kimi_k2"]).spec["model"]


@pytest.mark.parametrize("routing", [[], ONE_GROUP, LIMITING_GROUPS], ids=["preset", "one-group", "limiting-groups"])
def test_a_serve_only_kimi_k2_compiles_without_training_rules(lmspec, routing: list[str]) -> None:
    """Serving the HF checkpoint with vLLM: how megatron-core would score expert groups is no question."""
    result = lmspec("check", *KIMI_SERVE, *routing)
    assert result.code == 0, result.err
    assert "serves on 8 GPU(s): tp 8 x pp 1 x dp 1; 0 warnings" in result.out


def test_training_kimi_k2_still_gets_megatron_s_routing_rule(lmspec) -> None:
    result = lmspec("check", "model=kimi_k2", "hardware=h200_141g", "serve=null", *LIMITING_GROUPS)
    result.assert_reports(
        1,
        [
            'error: model.moe.router_group_topk=2 (command-line override) under model.family="deepseek_v3"',
            "with model.moe.top_k=8 megatron-core scores a group by its top 4 experts, transformers' and vLLM's "
            "deepseek_v3 by its top 2; set model.moe.top_k=4 or model.moe.router_group_topk=4",
        ],
    )


def test_one_group_limits_nothing_so_training_it_is_not_refused(lmspec) -> None:
    """n_group 1 / topk_group 1 (Kimi-K2's config.json): every token may use the one group, so neither
    megatron-core's group score nor transformers' changes which experts it gets."""
    result = lmspec("check", "model=kimi_k2", "hardware=h200_141g", "serve=null", *ONE_GROUP)
    assert "router_group_topk" not in result.err
