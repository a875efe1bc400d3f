"""vLLM judges the serving-at-scale keys as the build writes them: prefix caching, the expert all-to-all,
MTP speculative decoding and serve.extra_args in serve/vllm.yaml of DeepSeek-V3 over two nodes with
data-parallel attention and expert parallel (node 0's line and the headless worker's, as role_flags gives
them), EPLB on the same lines, and the two disaggregated pools' serve/<pool>/vllm.yaml with their
--kv-transfer-config. The model directory holds DeepSeek-V3's published config.json, so vLLM also builds
each line's engine config (its MTP draft config included) on this CPU.

vLLM's CPU build refuses EPLB's engine config on its platform alone ("only supported on CUDA devices or ROCm
devices or XPU devices"): an EPLB line is judged twice, as written (that refusal and no other) and with a
model directory without config.json (parsing and vLLM's serve command's checks, whose parsed arguments are
compared with the spec). The files come from the serve emitter (lmspec.compiler.emit.serve.emit_serve), the
same text `lmspec compile` writes. One `lmspec-vllm --check-batch` process judges every line: ~40 s.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from helpers.marks import needs_vllm
from helpers.paths import ROOT
from helpers.vllm_check import check_batch

from lmspec.compiler.build.files import SERVE_POOLS, VLLM_YAML, pool_files
from lmspec.compiler.emit.serve import KV_ROLES, emit_serve, role_flags
from lmspec.compiler.pipeline import make_plan
from lmspec.compiler.plan import Plan

pytestmark = [needs_vllm, pytest.mark.slow]

PRESET = ROOT / "specs" / "deepseek_v3_serve_16gpu_h100_fp8.yaml"  # tp 1 x dp 16 on 2 nodes, data_parallel, EP
HF_CONFIGS = Path(__file__).parents[1] / "data" / "hf_configs"
HEAD = "10.0.0.1"
FEATURES = (
    "serve.prefix_caching=false",
    "serve.all2all_backend=deepep_low_latency",
    "serve.speculative={method:mtp,num_tokens:1,acceptance_rate:0.7}",
    "+serve.extra_args.enable-chunked-prefill=false",
    "+serve.extra_args.long-prefill-token-threshold=2048",
)
EPLB = "serve.eplb={num_redundant_experts:32,window_size:500,step_interval:2000}"
POOLS = "serve.disaggregation={kv_connector:NixlConnector,prefill:{tp:8,dp:1,engines:1},decode:{tp:1,dp:8,engines:1}}"
CASES = {"features": FEATURES, "eplb": (*FEATURES, EPLB), "pools": (*FEATURES, POOLS)}
CPU_REFUSES_EPLB = "Expert parallelism load balancing is only supported on CUDA devices or ROCm devices or XPU devices"


def _write(root: Path, plan: Plan) -> Path:
    build = root / "build"
    for rel, text in emit_serve(plan).items():
        (build / rel).parent.mkdir(parents=True, exist_ok=True)
        (build / rel).write_text(text)
    return build


def _lines(plan: Plan, build: Path) -> dict[str, list[str]]:
    """Node 0's and the worker's command lines, and each pool's one engine line."""
    config = ["serve", "--config", str(build / VLLM_YAML)]
    lines = {
        "head": [*config, *(role_flags(plan, "head", HEAD, "0", "0") or [])],
        "worker1": [*config, *(role_flags(plan, "worker", HEAD, "8", "1") or [])],
    }
    if plan.served().spec.serve.disaggregation is not None:
        for pool in SERVE_POOLS:
            lines[pool] = ["serve", "--config", str(build / pool_files(pool)[0])]
    return lines


@pytest.fixture(scope="module")
def judged(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("scale")
    model, bare = root / "DeepSeek-V3", root / "no-config"
    model.mkdir()
    bare.mkdir()
    (model / "config.json").write_text((HF_CONFIGS / "DeepSeek-V3.json").read_text())
    plans, argvs = {}, {}
    for name, overrides in CASES.items():
        plan = make_plan([*overrides, f"serve.model_path={model}"], PRESET)
        plans[name] = plan
        for role, argv in _lines(plan, _write(root / name, plan)).items():
            argvs[(name, role)] = argv
            if name == "eplb":
                argvs[(name, f"{role}/parsed")] = [*argv, "--model", str(bare)]
    results = check_batch(list(argvs.values()), root)
    return {"plans": plans, "results": dict(zip(argvs, results, strict=True))}


@pytest.mark.parametrize("case", ["features", "pools"])
def test_every_line_builds_its_engine_config(case: str, judged: dict[str, Any]) -> None:
    lines = {role: r for (name, role), r in judged["results"].items() if name == case}
    assert set(lines) == ({"head", "worker1"} | (set(SERVE_POOLS) if case == "pools" else set()))
    for role, result in lines.items():
        assert result["exit"] == 0, (role, result["error"])
        assert result["args"]["_engine_config_built"] is True, role


def test_vllm_reads_the_features_as_the_spec_says(judged: dict[str, Any]) -> None:
    v = judged["plans"]["features"].served().spec.serve
    for role in ("head", "worker1"):
        args = judged["results"][("features", role)]["args"]
        assert args["enable_prefix_caching"] is False
        assert args["all2all_backend"] == v.all2all_backend == "deepep_low_latency"
        assert args["speculative_config"] == {"method": "mtp", "num_speculative_tokens": 1}
        assert args["enable_chunked_prefill"] is False and args["long_prefill_token_threshold"] == 2048
        assert args["enable_expert_parallel"] is True and args["data_parallel_size"] == 16


def test_data_parallel_ep_with_eplb_has_node0_and_headless_flags(judged: dict[str, Any]) -> None:
    """serve.multi_node=data_parallel with expert parallel: EPLB and the all-to-all ride in vllm.yaml on
    both nodes; node 0 serves the API, node 1 is headless from its first rank."""
    plan = judged["plans"]["eplb"]
    v, layout = plan.served().spec.serve, plan.served().layout
    assert layout.mode == "data_parallel" and layout.dp_ranks_per_node == 8
    for role in ("head", "worker1"):
        args = judged["results"][("eplb", f"{role}/parsed")]["args"]
        assert judged["results"][("eplb", f"{role}/parsed")]["exit"] == 0
        assert args["enable_eplb"] is True and args["all2all_backend"] == "deepep_low_latency"
        assert args["eplb_config"]["num_redundant_experts"] == 32
        assert (args["eplb_config"]["window_size"], args["eplb_config"]["step_interval"]) == (500, 2000)
        assert args["data_parallel_size_local"] == 8 and args["data_parallel_address"] == HEAD
        assert args["data_parallel_rpc_port"] == v.data_parallel_rpc_port
        assert args["headless"] is (role == "worker1") and args["_headless"] is (role == "worker1")
        assert args["data_parallel_start_rank"] == (8 if role == "worker1" else None)


def test_the_cpu_build_refuses_eplb_only_for_its_platform(judged: dict[str, Any]) -> None:
    for role in ("head", "worker1"):
        result = judged["results"][("eplb", role)]
        assert result["exit"] == 1 and CPU_REFUSES_EPLB in result["error"], result["error"]
        assert result["error"].count("validation error") == 1 and "1 validation error" in result["error"]


def test_each_pool_is_its_own_engine_with_its_kv_role(judged: dict[str, Any]) -> None:
    d = judged["plans"]["pools"].served().spec.serve.disaggregation
    assert d is not None
    for pool in SERVE_POOLS:
        args, p = judged["results"][("pools", pool)]["args"], getattr(d, pool)
        assert (args["tensor_parallel_size"], args["data_parallel_size"], args["pipeline_parallel_size"]) == (
            p.tp,
            p.dp,
            1,
        )
        transfer = args["kv_transfer_config"]
        assert (transfer["kv_connector"], transfer["kv_role"]) == (d.kv_connector, KV_ROLES[pool])
        assert args["speculative_config"] == {"method": "mtp", "num_speculative_tokens": 1}
