"""serve/vllm.yaml says what the Plan says; serve/serve.sh is shellcheck-clean, quoted, and hands
vLLM the key through its environment only. serve.sh runs for real here, with a recording
stand-in for the `vllm` executable (vLLM itself is judged in test_vllm_judge.py)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers.build import compile_build

from lmspec.compiler.build.files import SERVE_SH, VLLM_YAML
from lmspec.compiler.plan import Plan

PRESETS = {
    "tiny": (None, []),
    "llama3_70b": ("llama3_70b_pretrain_64gpu_h100_bf16", []),
    "llama3_8b": ("llama3_8b_pretrain_8gpu_h100_bf16", []),
    "tiny_no_prefix_caching": (None, ["serve.prefix_caching=false"]),
}
SECRET = "sk-lmspec-test-secret-never-written"
RECORDER = """\
import json, os, sys
names = ("VLLM_API_KEY", "HF_HUB_OFFLINE", "VLLM_CACHE_ROOT", "VLLM_CPU_KVCACHE_SPACE")
with open(os.environ["RECORD_TO"], "w") as fh:
    json.dump({"argv": sys.argv[1:], "env": {n: os.environ.get(n) for n in names}}, fh)
"""


ALL_OPTIONS = (
    "model",
    "served-model-name",
    "host",
    "port",
    "dtype",
    "tensor-parallel-size",
    "pipeline-parallel-size",
    "data-parallel-size",
    "enable-expert-parallel",
    "enable-eplb",
    "eplb-config",
    "all2all-backend",
    "max-model-len",
    "gpu-memory-utilization",
    "max-num-seqs",
    "max-num-batched-tokens",
    "enable-prefix-caching",
    "no-enable-prefix-caching",
    "speculative-config",
    "kv-cache-dtype",
    "quantization",
    "enforce-eager",
    "attention-backend",
)


def _option(plan: Plan, key: str) -> object:
    """The spec value each vLLM option must carry (the table a reviewer checks by eye)."""
    v, s = plan.spec.serve, plan.spec
    return {
        "model": v.model_path or s.convert.output,
        "served-model-name": v.served_model_name,
        "host": v.host,
        "port": v.port,
        "dtype": v.dtype,
        "tensor-parallel-size": v.tp,
        "pipeline-parallel-size": v.pp,
        "data-parallel-size": v.dp,
        "enable-expert-parallel": v.expert_parallel,
        "enable-eplb": True if v.eplb else None,
        "eplb-config": dataclasses.asdict(v.eplb) if v.eplb else None,
        "all2all-backend": v.all2all_backend,
        "max-model-len": v.max_model_len,
        "gpu-memory-utilization": v.gpu_memory_utilization,
        "max-num-seqs": v.max_num_seqs,
        "max-num-batched-tokens": v.max_num_batched_tokens,
        # vLLM's `--config` drops a false boolean: off is spelled no-enable-prefix-caching: true
        "enable-prefix-caching": True if v.prefix_caching else None,
        "no-enable-prefix-caching": None if v.prefix_caching else True,
        "speculative-config": (
            {"method": v.speculative.method, "num_speculative_tokens": v.speculative.num_tokens}
            if v.speculative
            else None
        ),
        "kv-cache-dtype": v.kv_cache_dtype,
        "quantization": v.quantization,
        "enforce-eager": v.enforce_eager,
        "attention-backend": "CPU_MLA" if plan.device == "cpu" and s.model.attention == "mla" else None,
    }[key]


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Plan, Path]]:
    root = tmp_path_factory.mktemp("builds")
    return {name: compile_build(root / name, overrides, spec) for name, (spec, overrides) in PRESETS.items()}


@pytest.mark.parametrize("name", PRESETS)
def test_vllm_yaml_carries_every_serving_value_of_the_plan(name: str, builds: dict[str, tuple[Plan, Path]]) -> None:
    plan, build = builds[name]
    options = yaml.safe_load((build / VLLM_YAML).read_text())
    unset = {k for k in ALL_OPTIONS if _option(plan, k) is None}  # left to vLLM's default
    assert set(options) == set(ALL_OPTIONS) - unset
    for key, value in options.items():
        assert value == _option(plan, key), key


def test_tiny_serves_the_cpu_settings(builds: dict[str, tuple[Plan, Path]]) -> None:
    options = yaml.safe_load((builds["tiny"][1] / VLLM_YAML).read_text())
    assert options["dtype"] == "float32" and options["enforce-eager"] is True
    assert options["tensor-parallel-size"] == 1 and options["max-model-len"] == 128
    assert options["model"] == "runs/tiny/hf"


@pytest.mark.parametrize("name", PRESETS)
def test_serve_sh_has_no_shellcheck_findings(name: str, builds: dict[str, tuple[Plan, Path]], shellcheck: str) -> None:
    result = subprocess.run(
        [shellcheck, "--format=gcc", str(builds[name][1] / SERVE_SH)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _run_serve_sh(
    build: Path, cwd: Path, env_extra: dict[str, str], *extra: str
) -> tuple[subprocess.CompletedProcess[str], dict]:
    recorder = cwd / "fake_vllm"
    recorder.write_text(f"#!{sys.executable}\n{RECORDER}")
    recorder.chmod(0o755)
    record = cwd / "record.json"
    record.unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("VLLM_API_KEY", "MY_SERVING_KEY")}
    env.update({"LMSPEC_VLLM": str(recorder), "RECORD_TO": str(record), **env_extra})
    result = subprocess.run(
        ["bash", str(build / SERVE_SH), *extra],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    return result, (json.loads(record.read_text()) if record.is_file() else {})


def _model_dir(cwd: Path, rel: str) -> None:
    (cwd / rel).mkdir(parents=True, exist_ok=True)
    (cwd / rel / "config.json").write_text("{}")


def test_serve_sh_passes_the_key_by_environment_and_the_options_by_file(tmp_path: Path) -> None:
    plan, build = compile_build(tmp_path / "build", [])
    _model_dir(tmp_path, "runs/tiny/hf")
    result, record = _run_serve_sh(build, tmp_path, {"VLLM_API_KEY": SECRET}, "--max-num-seqs", "2")
    assert result.returncode == 0, result.stderr
    assert record["argv"] == ["serve", "--config", str(build / VLLM_YAML), "--max-num-seqs", "2"]
    assert record["env"] == {
        "VLLM_API_KEY": SECRET,
        "HF_HUB_OFFLINE": "1",
        "VLLM_CACHE_ROOT": f"{tmp_path}/runs/tiny/vllm_cache",
        "VLLM_CPU_KVCACHE_SPACE": str(int(plan.spec.serve.cpu_kvcache_space_gib)),
    }


def test_serve_sh_reads_the_key_from_the_variable_the_spec_names(tmp_path: Path) -> None:
    _, build = compile_build(tmp_path / "build", ["serve.api_key_env=MY_SERVING_KEY"])
    _model_dir(tmp_path, "runs/tiny/hf")
    result, record = _run_serve_sh(build, tmp_path, {"MY_SERVING_KEY": SECRET})
    assert result.returncode == 0, result.stderr
    assert record["env"]["VLLM_API_KEY"] == SECRET
    result, record = _run_serve_sh(build, tmp_path, {})
    assert result.returncode != 0 and not record
    assert "set MY_SERVING_KEY to the API key" in result.stderr


def test_no_key_in_the_spec_means_no_key_even_if_one_is_in_the_environment(tmp_path: Path) -> None:
    _, build = compile_build(tmp_path / "build", ["serve.api_key_env=null"])
    _model_dir(tmp_path, "runs/tiny/hf")
    result, record = _run_serve_sh(build, tmp_path, {"VLLM_API_KEY": SECRET})
    assert result.returncode == 0, result.stderr
    assert record["env"]["VLLM_API_KEY"] is None


def test_the_key_is_never_written_into_the_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_API_KEY", SECRET)
    monkeypatch.setenv("MY_SERVING_KEY", SECRET)
    _, build = compile_build(tmp_path / "build", ["serve.api_key_env=MY_SERVING_KEY"])
    files = [p for p in build.rglob("*") if p.is_file()]
    assert files and not [p for p in files if SECRET in p.read_text()]


def test_gpu_builds_do_not_set_the_cpu_kv_cache(builds: dict[str, tuple[Plan, Path]]) -> None:
    text = (builds["llama3_70b"][1] / SERVE_SH).read_text()
    assert "VLLM_CPU_KVCACHE_SPACE" not in text and '"${LMSPEC_VLLM:-vllm}" serve' in text
    assert "VLLM_CPU_KVCACHE_SPACE=1" in (builds["tiny"][1] / SERVE_SH).read_text()


def test_missing_model_stops_before_vllm_with_the_fix(tmp_path: Path) -> None:
    _, build = compile_build(tmp_path / "build", [])
    result, record = _run_serve_sh(build, tmp_path, {"VLLM_API_KEY": SECRET})
    assert result.returncode == 2 and not record
    assert "no model at runs/tiny/hf" in result.stderr and "convert stage" in result.stderr


def _hydra_quoted(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def test_hostile_model_path_and_name_stay_data(tmp_path: Path, shellcheck: str) -> None:
    hostile = str(tmp_path / "it's a $(touch pwned) `x` dir")
    name = 'tiny "quoted" $HOME'
    plan, build = compile_build(
        tmp_path / "build",
        [f"serve.model_path={_hydra_quoted(hostile)}", f"serve.served_model_name={_hydra_quoted(name)}"],
    )
    assert plan.spec.serve.model_path == hostile
    options = yaml.safe_load((build / VLLM_YAML).read_text())
    assert options["model"] == hostile and options["served-model-name"] == name
    _model_dir(tmp_path, hostile)
    result, record = _run_serve_sh(build, tmp_path, {"VLLM_API_KEY": SECRET})
    assert result.returncode == 0, result.stderr
    assert record["argv"][:3] == ["serve", "--config", str(build / VLLM_YAML)]
    assert not (tmp_path / "pwned").exists()
    check = subprocess.run([shellcheck, str(build / SERVE_SH)], capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stdout


def test_report_states_the_serving_layout_and_the_calibration_need(tmp_path: Path) -> None:
    _, build = compile_build(tmp_path / "build", ["serve.quantization=awq", "serve.model_path=/models/tiny-awq"])
    report = (build / "REPORT.md").read_text()
    serving = report[report.index("## Serving (vLLM)") :]
    assert "| engine layout | tp 1 x pp 1 x dp 1 = 1 GPU(s) |" in serving
    assert "| quantization | AWQ: needs an AWQ-calibrated checkpoint" in serving
    assert "| model served | `/models/tiny-awq` (serve.model_path) |" in serving
    assert "| endpoint | http://127.0.0.1:8000/v1 as `tiny`, key from $VLLM_API_KEY |" in serving
    assert "| concurrent sequences of 128 tokens (per engine) |" in serving
    assert "| node role serve (node 0) | 1 GPU(s) used per node; 1 engine(s): " in serving
    assert "| TPOT | " in serving and "a step: linear layers" in serving and "| throughput | " in serving
