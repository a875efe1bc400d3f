"""vLLM judges every command line of every node role: serve.sh's one-node engine, head.sh's and
worker.sh's `vllm serve --config vllm.yaml` plus the role's flags (lmspec.compiler.emit.serve.role_flags,
the list the scripts place; test_serve_scripts.py runs the scripts and checks they pass exactly that).
Each line goes to vLLM's parser, its serve command's own checks and, where the model directory holds
a config.json, its engine config, in one `lmspec-vllm --check-batch` process. The model directories
hold the PUBLISHED config.json of the model served (tests/data/hf_configs), so vLLM also checks the
args against the checkpoint: tp against heads, max_model_len against its derived length, expert
parallel against experts, --quantization against quantization_config; the CPU examples serve a tiny
random HF Llama. Kimi-K2's config.json (model_type kimi_k2, which transformers does not ship and vLLM
reads as DeepseekV3Config) lives in tests/data/hf_configs_remote.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from helpers.build import compile_build
from helpers.hf import save_random_hf_llama
from helpers.marks import needs_vllm
from helpers.vllm_check import check_batch

from lmspec.compiler.build.files import SERVE_HEAD_SH, SERVE_SH, SERVE_WORKER_SH, VLLM_YAML, serve_scripts
from lmspec.compiler.conversion.mapping import hf_config
from lmspec.compiler.emit.serve import role_flags
from lmspec.compiler.models.serve_length import vllm_max_model_len
from lmspec.compiler.pipeline import make_plan
from lmspec.compiler.plan import Plan

pytestmark = [needs_vllm, pytest.mark.slow]  # one vLLM process judges every line: ~40 s

HF_CONFIGS = Path(__file__).parents[1] / "data" / "hf_configs"
REMOTE_CODE_CONFIGS = HF_CONFIGS.with_name("hf_configs_remote")  # released with their own modeling code
HEAD = "10.0.0.1"  # what an operator passes as HEAD_ADDRESS
SERVE_ONLY_CPU = ["train=null", "parallel=null", "convert=null", "hardware=cpu", "serve.max_model_len=128"]


@dataclass(frozen=True)
class Case:
    spec: str | None
    overrides: tuple[str, ...]
    # published config.json (tests/data/hf_configs/NAME.json); "converted": lmspec's conversion of the
    # spec's model (compiler/conversion/mapping.hf_config); None: a tiny random HF Llama
    config: str | None
    drop_quantization: bool = False  # a bf16 conversion of a checkpoint released in fp8
    engine_config: bool = True  # vLLM's CPU build can build the engine config of every line


CASES = {
    "deepseek_v3_serve_8gpu_h200_fp8": Case("deepseek_v3_serve_8gpu_h200_fp8", (), "DeepSeek-V3"),
    "deepseek_v3_serve_16gpu_h100_fp8": Case("deepseek_v3_serve_16gpu_h100_fp8", (), "DeepSeek-V3"),
    "llama3_70b_serve_8gpu_h100_bf16": Case("llama3_70b_serve_8gpu_h100_bf16", (), "Llama-3.1-70B"),
    # the multi-node examples: tensor parallel in a node, pipeline across nodes, over Ray
    "deepseek_v3_bf16_tp8_pp3_3x8_h200_ray": Case(
        "deepseek_v3_serve_8gpu_h200_fp8",
        (
            "hardware.nodes=3",
            "serve.pp=3",
            "serve.quantization=null",
            "serve.expert_parallel=false",
            "serve.host=0.0.0.0",
            "serve.multi_node=ray",
        ),
        "DeepSeek-V3",
        drop_quantization=True,
    ),
    "llama3_70b_tp8_pp2_2x8_h100_ray": Case(
        "llama3_70b_serve_8gpu_h100_bf16",
        ("hardware.nodes=2", "serve.pp=2", "serve.host=0.0.0.0", "serve.multi_node=ray"),
        "Llama-3.1-70B",
    ),
    # the same engines with vLLM's multiprocessing executor across nodes (what auto picks for them)
    "deepseek_v3_bf16_tp8_pp3_3x8_h200_mp": Case(
        "deepseek_v3_serve_8gpu_h200_fp8",
        (
            "hardware.nodes=3",
            "serve.pp=3",
            "serve.quantization=null",
            "serve.expert_parallel=false",
            "serve.host=0.0.0.0",
        ),
        "DeepSeek-V3",
        drop_quantization=True,
    ),
    "llama3_70b_tp8_pp2_2x8_h100_mp": Case(
        "llama3_70b_serve_8gpu_h100_bf16", ("hardware.nodes=2", "serve.pp=2", "serve.host=0.0.0.0"), "Llama-3.1-70B"
    ),
    # Kimi-K2 as released (FP8) on two nodes of 8 x H200: serve-only, no training rule applies
    "kimi_k2_fp8_tp8_pp2_2x8_h200_mp": Case(
        None,
        (
            "model=kimi_k2",
            "train=null",
            "parallel=null",
            "convert=null",
            "hardware=h200_141g",
            "hardware.nodes=2",
            "serve.tp=8",
            "serve.pp=2",
            "serve.quantization=fp8",
            "serve.max_model_len=65536",
            "serve.served_model_name=kimi-k2",
            "serve.host=0.0.0.0",
        ),
        "Kimi-K2-Instruct",
    ),
    # two such engines under one Ray cluster: vLLM places the data-parallel ranks as Ray actors too
    "llama3_70b_tp8_pp2_dp2_4x8_h100_ray": Case(
        "llama3_70b_serve_8gpu_h100_bf16",
        ("hardware.nodes=4", "serve.pp=2", "serve.dp=2", "serve.host=0.0.0.0"),
        "Llama-3.1-70B",
    ),
    # data parallel over two CPU "nodes" (the engine test_serve_multinode_cpu.py starts for real)
    "tiny_dp2_2x1_cpu": Case(
        None,
        (*SERVE_ONLY_CPU, "hardware.gpus_per_node=1", "hardware.nodes=2", "serve.dp=2", "serve.host=0.0.0.0"),
        None,
    ),
    # DeepSeek's MLA latent on vLLM's CPU: vllm.yaml names the CPU_MLA backend (fp32), a model of lmspec's converter
    "tiny_moe_deepseek_latent_cpu": Case(
        None,
        (
            "model=tiny_moe",
            *SERVE_ONLY_CPU,
            "model.mla.kv_lora_rank=512",
            "model.mla.qk_rope_head_dim=64",
            "model.head_dim=96",
        ),
        "converted",
    ),
    "tiny_tp1_pp2_2x1_cpu_ray": Case(
        None,
        (
            *SERVE_ONLY_CPU,
            "hardware.gpus_per_node=1",
            "hardware.nodes=2",
            "serve.pp=2",
            "serve.host=0.0.0.0",
            "serve.multi_node=ray",
        ),
        None,
    ),
    # tensor parallel over two CPU "nodes" (the engine test_serve_mp_two_hosts.py starts for real)
    "tiny_tp2_2x1_cpu_mp": Case(
        None,
        (*SERVE_ONLY_CPU, "hardware.gpus_per_node=1", "hardware.nodes=2", "serve.tp=2", "serve.host=0.0.0.0"),
        None,
    ),
}
CONVERTED = "converted"
WRONG_HEADLESS = ("wrong", "headless-with-api-servers")


def _model_dir(root: Path, name: str, case: Case) -> Path:
    model = root / f"{name}-model"
    model.mkdir(parents=True)
    if case.config is None:  # the tiny model of the train+serve default spec, random weights
        save_random_hf_llama(compile_build(root / "tiny-probe" / name, [])[0], model)
        return model
    if case.config == CONVERTED:
        # the train+serve spec of the same model converts it (a serve-only one has no conversion)
        plan = make_plan([o for o in case.overrides if o.startswith("model")], Path(case.spec) if case.spec else None)
        (model / "config.json").write_text(json.dumps(hf_config(plan)))
        return model
    config = json.loads(_published(case.config).read_text())
    if case.drop_quantization:
        config.pop("quantization_config", None)
    (model / "config.json").write_text(json.dumps(config))
    return model


def _published(name: str) -> Path:
    """The release's config.json: transformers' own model types, else one with its own modeling code."""
    path = HF_CONFIGS / f"{name}.json"
    return path if path.is_file() else REMOTE_CODE_CONFIGS / f"{name}.json"


def role_argvs(plan: Plan, build: Path) -> dict[str, list[str]]:
    """Every `vllm` command line the build's scripts run, per role, as they run it."""
    config = ["serve", "--config", str(build / VLLM_YAML)]
    layout = plan.served().layout
    argvs: dict[str, list[str]] = {}
    for script in serve_scripts(plan.served().layout.nodes):
        if script == SERVE_SH:
            argvs["serve"] = [*config, *(role_flags(plan, "serve", HEAD, "0", "0") or [])]
        elif script == SERVE_HEAD_SH:
            argvs["head"] = [*config, *(role_flags(plan, "head", HEAD, "0", "0") or [])]
        else:
            assert script == SERVE_WORKER_SH
            for k in range(1, layout.nodes):
                flags = role_flags(plan, "worker", HEAD, str(k * layout.dp_ranks_per_node), str(k))
                if flags is not None:  # a Ray worker runs no vLLM: `ray start --address=HEAD:PORT --block`
                    argvs[f"worker{k}"] = [*config, *flags]
    return argvs


@pytest.fixture(scope="module")
def judged(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("roles")
    plans: dict[str, Plan] = {}
    argvs: dict[tuple[str, str], list[str]] = {}
    for name, case in CASES.items():
        model = _model_dir(root, name, case)
        plan, build = compile_build(root / name, [*case.overrides, f"serve.model_path={model}"], case.spec)
        plans[name] = plan
        for role, argv in role_argvs(plan, build).items():
            argvs[(name, role)] = argv
    argvs[WRONG_HEADLESS] = [*argvs[("tiny_dp2_2x1_cpu", "worker1")], "--api-server-count", "2"]
    results = check_batch(list(argvs.values()), root)
    return {"plans": plans, "argvs": argvs, "results": dict(zip(argvs, results))}


ROLE_LINES = {  # the lines each case must have: what the script interface says each node runs
    "deepseek_v3_serve_8gpu_h200_fp8": {"serve"},
    "deepseek_v3_serve_16gpu_h100_fp8": {"head", "worker1"},
    "llama3_70b_serve_8gpu_h100_bf16": {"serve"},
    "deepseek_v3_bf16_tp8_pp3_3x8_h200_ray": {"head"},
    "llama3_70b_tp8_pp2_2x8_h100_ray": {"head"},
    "llama3_70b_tp8_pp2_dp2_4x8_h100_ray": {"head"},
    "tiny_dp2_2x1_cpu": {"head", "worker1"},
    "tiny_tp1_pp2_2x1_cpu_ray": {"head"},
    "deepseek_v3_bf16_tp8_pp3_3x8_h200_mp": {"head", "worker1", "worker2"},
    "llama3_70b_tp8_pp2_2x8_h100_mp": {"head", "worker1"},
    "kimi_k2_fp8_tp8_pp2_2x8_h200_mp": {"head", "worker1"},
    "tiny_tp2_2x1_cpu_mp": {"head", "worker1"},
    "tiny_moe_deepseek_latent_cpu": {"serve"},
}


@pytest.mark.parametrize("name", CASES)
def test_every_role_line_is_accepted_and_builds_its_engine_config(name: str, judged: dict[str, Any]) -> None:
    roles = {role for case, role in judged["results"] if case == name}
    assert roles == ROLE_LINES[name]
    for role in roles:
        result = judged["results"][(name, role)]
        assert result["exit"] == 0, (role, result["error"])
        assert result["args"]["_engine_config_built"] is True, role
        assert result["args"]["_headless"] is role.startswith("worker"), role


@pytest.mark.parametrize("name", CASES)
def test_vllm_reads_each_role_as_the_layout_says(name: str, judged: dict[str, Any]) -> None:
    plan = judged["plans"][name]
    v, layout = plan.served().spec.serve, plan.served().layout
    for (case, role), result in judged["results"].items():
        if case != name:
            continue
        args = result["args"]
        assert (args["tensor_parallel_size"], args["pipeline_parallel_size"]) == (v.tp, v.pp)
        assert args["data_parallel_size"] == v.dp and args["host"] == v.host
        if layout.mode == "ray":
            assert args["distributed_executor_backend"] == "ray"
            assert args["data_parallel_backend"] == ("ray" if v.dp > 1 else "mp")
        elif layout.mode == "mp":
            assert args["distributed_executor_backend"] == "mp" and args["nnodes"] == layout.nodes
            assert args["node_rank"] == (0 if role == "head" else int(role.removeprefix("worker")))
            assert (args["master_addr"], args["master_port"]) == (HEAD, v.master_port)
            assert args["headless"] is (role != "head") and args["data_parallel_size_local"] is None
        elif layout.mode == "data_parallel":
            assert args["data_parallel_size_local"] == layout.dp_ranks_per_node
            assert (args["data_parallel_address"], args["data_parallel_rpc_port"]) == (HEAD, v.data_parallel_rpc_port)
            start = int(role.removeprefix("worker")) * layout.dp_ranks_per_node if role != "head" else None
            assert args["data_parallel_start_rank"] == start and args["headless"] is (role != "head")
        else:
            assert args["distributed_executor_backend"] is None and args["data_parallel_size_local"] is None


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if c.config not in (None, CONVERTED)])
def test_args_agree_with_the_published_config(name: str, judged: dict[str, Any]) -> None:
    """What vLLM's engine config also refuses, stated against the checkpoint's own config.json."""
    case, plan = CASES[name], judged["plans"][name]
    assert case.config is not None
    config = json.loads(_published(case.config).read_text())
    v = plan.served().spec.serve
    assert config["num_attention_heads"] % v.tp == 0
    scaling = config.get("rope_scaling") or {}
    factor = scaling.get("factor", 1.0) if scaling.get("rope_type", scaling.get("type")) == "linear" else 1.0
    # (the Llama presets' model is Llama-3's 8,192 positions; the published config is Llama-3.1's 131,072)
    assert v.max_model_len <= min(config["max_position_embeddings"] * factor, vllm_max_model_len(plan.spec.model))
    experts = config.get("n_routed_experts") or config.get("num_local_experts") or 0
    assert not v.expert_parallel or experts > 0
    quantized = None if case.drop_quantization else config.get("quantization_config", {}).get("quant_method")
    assert v.quantization == quantized


def test_a_headless_line_with_api_servers_is_refused_by_vllms_serve_command(judged: dict[str, Any]) -> None:
    """lmspec-vllm --check runs vLLM's serve command, whose own checks refuse what its parser lets by."""
    result = judged["results"][WRONG_HEADLESS]
    assert result["exit"] == 1 and "cannot be used with --headless" in result["error"], result


def test_cpu_mla_serves_with_vllms_cpu_mla_backend(judged: dict[str, Any]) -> None:
    args = judged["results"][("tiny_moe_deepseek_latent_cpu", "serve")]["args"]
    assert args["attention_backend"] in (
        "CPU_MLA",
        "AttentionBackendEnum.CPU_MLA",
        "<AttentionBackendEnum.CPU_MLA: 'CPU_MLA'>",
    )
