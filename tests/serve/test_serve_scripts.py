"""serve/head.sh, serve/worker.sh and serve/sbatch.sh of a multi-node engine, run for real with
recording stand-ins for `vllm`, `ray`, `srun` and `scontrol`: each runs exactly the command line
test_vllm_judge_roles.py hands vLLM (role_flags after `serve --config vllm.yaml`), checks its
arguments (usage, exit 2), and stays shellcheck-clean with hostile values."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.build import compile_build

from lmspec.compiler.build.files import (
    NCCL_ENV,
    SERVE_HEAD_SH,
    SERVE_SBATCH_SH,
    SERVE_SH,
    SERVE_WORKER_SH,
    VLLM_YAML,
)
from lmspec.compiler.emit.serve import role_flags
from lmspec.compiler.models.serve_perf import perf_dict
from lmspec.compiler.plan import Plan

SERVE_ONLY = ["train=null", "parallel=null", "convert=null", "serve.max_model_len=128", "serve.api_key_env=null"]
DP2 = [*SERVE_ONLY, "hardware.gpus_per_node=1", "hardware.nodes=2", "serve.dp=2", "serve.host=0.0.0.0"]
# two nodes of two CPU "GPUs" each, two data-parallel ranks per node
DP4 = [*SERVE_ONLY, "hardware.gpus_per_node=2", "hardware.nodes=2", "serve.dp=4", "serve.host=0.0.0.0"]
RAY = [
    "--spec",
    "llama3_70b_serve_8gpu_h100_bf16",
    "hardware.nodes=2",
    "serve.pp=2",
    "serve.host=0.0.0.0",
    "serve.api_key_env=null",
    "serve.multi_node=ray",
]
# the same engine with vLLM's multiprocessing executor across the two nodes (auto's choice for it)
MP = [*RAY[:-1], "serve.multi_node=mp"]
RECORDER = """\
import json, os, sys
with open(os.environ["RECORD_TO"], "a") as fh:
    fh.write(json.dumps({"prog": os.path.basename(sys.argv[0]), "argv": sys.argv[1:]}) + "\\n")
"""
HEAD = "10.0.0.1"


def _compile(tmp: Path, overrides: list[str]) -> tuple[Plan, Path]:
    """compile_build with a leading `--spec NAME` taken as the preset."""
    spec = overrides[1] if overrides[:1] == ["--spec"] else None
    return compile_build(tmp / "build", overrides[2:] if spec else overrides, spec)


def _tools(tmp: Path, ray_joined: str = "2 16") -> dict[str, str]:
    """Recording `vllm`, `ray`, `srun`, `scontrol` and an LMSPEC_PYTHON that reports the Ray cluster."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    for prog in ("vllm", "ray", "srun"):
        (bin_dir / prog).write_text(f"#!{sys.executable}\n{RECORDER}")
        (bin_dir / prog).chmod(0o755)
    (bin_dir / "scontrol").write_text("#!/bin/sh\nprintf 'node-a\\nnode-b\\n'\n")
    (bin_dir / "scontrol").chmod(0o755)
    (bin_dir / "python_ray").write_text(f"#!/bin/sh\necho '{ray_joined}'\n")
    (bin_dir / "python_ray").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "VLLM_API_KEY"}
    env.update(
        PATH=f"{bin_dir}:{env['PATH']}",
        LMSPEC_VLLM=str(bin_dir / "vllm"),
        LMSPEC_PYTHON=str(bin_dir / "python_ray"),
        LMSPEC_RAY_WAIT_S="0",
        RECORD_TO=str(tmp / "record.jsonl"),
    )
    return env


def _run(build: Path, script: str, cwd: Path, env: dict[str, str], *args: str) -> tuple[int, str, list[dict]]:
    record = Path(env["RECORD_TO"])
    record.unlink(missing_ok=True)
    proc = subprocess.run(
        ["bash", str(build / script), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60, check=False
    )
    calls = [json.loads(line) for line in record.read_text().splitlines()] if record.is_file() else []
    return proc.returncode, proc.stderr, calls


def _model(cwd: Path, rel: str) -> None:
    (cwd / rel).mkdir(parents=True, exist_ok=True)
    (cwd / rel / "config.json").write_text("{}")


@pytest.mark.parametrize("overrides", [DP2, DP4], ids=["dp2-1-per-node", "dp4-2-per-node"])
def test_data_parallel_scripts_run_the_judged_lines(tmp_path: Path, overrides: list[str]) -> None:
    plan, build = _compile(tmp_path, [*overrides, "serve.model_path=models/tiny"])
    assert not (build / SERVE_SH).exists() and (build / SERVE_HEAD_SH).is_file()
    _model(tmp_path, "models/tiny")
    env = _tools(tmp_path)
    config = ["serve", "--config", str(build / VLLM_YAML)]
    code, err, calls = _run(build, SERVE_HEAD_SH, tmp_path, env, HEAD, "--max-num-seqs", "2")
    assert code == 0, err
    assert calls == [
        {"prog": "vllm", "argv": [*config, *role_flags(plan, "head", HEAD, "0", "0"), "--max-num-seqs", "2"]}
    ]
    n = plan.served().layout.dp_ranks_per_node
    code, err, calls = _run(build, SERVE_WORKER_SH, tmp_path, env, HEAD, "1")
    assert code == 0, err
    assert calls == [{"prog": "vllm", "argv": [*config, *role_flags(plan, "worker", HEAD, str(n), "1")]}]
    assert calls[0]["argv"][-2:] == ["--data-parallel-start-rank", str(n)] and "--headless" in calls[0]["argv"]


def test_ray_scripts_wait_for_the_cluster_then_serve(tmp_path: Path) -> None:
    plan, build = _compile(tmp_path, [*RAY, "serve.model_path=models/llama"])
    _model(tmp_path, "models/llama")
    env = _tools(tmp_path)
    code, err, calls = _run(build, SERVE_HEAD_SH, tmp_path, env, HEAD)
    assert code == 0, err
    assert [c["prog"] for c in calls] == ["ray", "vllm", "ray"]  # head, vLLM, `ray stop` on exit
    assert calls[0]["argv"] == ["start", "--head", f"--node-ip-address={HEAD}", "--port=6379"]
    assert calls[1]["argv"] == ["serve", "--config", str(build / VLLM_YAML), *role_flags(plan, "head", HEAD, "0", "0")]
    assert calls[2]["argv"] == ["stop"]
    code, err, calls = _run(build, SERVE_WORKER_SH, tmp_path, env, HEAD, "1")
    assert code == 0, err
    assert calls == [{"prog": "ray", "argv": ["start", f"--address={HEAD}:6379", "--block"]}]
    assert role_flags(plan, "worker", HEAD, "1", "1") is None


def test_mp_scripts_run_the_judged_lines_and_nothing_else(tmp_path: Path) -> None:
    """No Ray: node 0 and the worker each run `vllm serve` with their node rank, and only that."""
    plan, build = _compile(tmp_path, [*MP, "serve.model_path=models/llama"])
    assert plan.served().layout.mode == "mp"
    _model(tmp_path, "models/llama")
    env = _tools(tmp_path)
    config = ["serve", "--config", str(build / VLLM_YAML)]
    code, err, calls = _run(build, SERVE_HEAD_SH, tmp_path, env, HEAD, "--max-num-seqs", "2")
    assert code == 0, err
    assert calls == [
        {"prog": "vllm", "argv": [*config, *role_flags(plan, "head", HEAD, "0", "0"), "--max-num-seqs", "2"]}
    ]
    code, err, calls = _run(build, SERVE_WORKER_SH, tmp_path, env, HEAD, "1")
    assert code == 0, err
    assert calls == [{"prog": "vllm", "argv": [*config, *role_flags(plan, "worker", HEAD, "1", "1")]}]
    assert calls[0]["argv"][len(config) :] == [
        *("--distributed-executor-backend", "mp", "--nnodes", "2", "--node-rank", "1"),
        *("--master-addr", HEAD, "--master-port", str(plan.spec.serve.master_port), "--headless"),
    ]
    assert "ray start" not in (build / SERVE_HEAD_SH).read_text() + (build / SERVE_WORKER_SH).read_text()


def test_ray_head_gives_up_with_a_clear_message(tmp_path: Path) -> None:
    _, build = _compile(tmp_path, [*RAY, "serve.model_path=models/llama"])
    _model(tmp_path, "models/llama")
    code, err, calls = _run(build, SERVE_HEAD_SH, tmp_path, _tools(tmp_path, ray_joined="1 8"), HEAD)
    assert code == 1 and [c["prog"] for c in calls] == ["ray", "ray"], err  # no vLLM; ray stopped
    assert "the Ray cluster has 1 of 2 nodes and 8 of 16 GPUs" in err and "bash serve/worker.sh 10.0.0.1" in err


@pytest.mark.parametrize(
    ("script", "args", "message"),
    [
        (SERVE_HEAD_SH, [], "usage: bash serve/head.sh HEAD_ADDRESS"),
        (SERVE_HEAD_SH, ["--port"], "usage: bash serve/head.sh HEAD_ADDRESS"),
        (SERVE_WORKER_SH, [HEAD], "usage: bash serve/worker.sh HEAD_ADDRESS NODE_RANK"),
        (SERVE_WORKER_SH, [HEAD, "0"], "NODE_RANK must be a whole number in 1..1, not 0"),
        (SERVE_WORKER_SH, [HEAD, "2"], "NODE_RANK must be a whole number in 1..1, not 2"),
        (SERVE_WORKER_SH, [HEAD, "x"], "NODE_RANK must be a whole number in 1..1, not x"),
    ],
)
def test_bad_arguments_exit_2_with_the_usage(tmp_path: Path, script: str, args: list[str], message: str) -> None:
    _, build = _compile(tmp_path, [*DP2, "serve.model_path=models/tiny"])
    _model(tmp_path, "models/tiny")
    code, err, calls = _run(build, script, tmp_path, _tools(tmp_path), *args)
    assert code == 2 and message in err and not calls, err


def test_a_node_without_the_model_is_told_so(tmp_path: Path) -> None:
    _, build = _compile(tmp_path, [*DP2, "serve.model_path=models/tiny"])
    code, err, calls = _run(build, SERVE_WORKER_SH, tmp_path, _tools(tmp_path), HEAD, "1")
    assert code == 2 and "worker.sh: no model at models/tiny (no config.json) on this node" in err and not calls


def test_sbatch_starts_one_task_per_node_with_its_role(tmp_path: Path) -> None:
    plan, build = _compile(
        tmp_path,
        [*RAY, "serve.model_path=models/llama", "cluster.launcher=slurm", "cluster.slurm.partition=gpu"],
    )
    text = (build / SERVE_SBATCH_SH).read_text()
    for line in (
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --gpus-per-node=8",
        "#SBATCH --partition=gpu",
    ):
        assert line in text.splitlines(), line
    assert "--requeue" not in text and "--signal" not in text  # a server neither checkpoints nor requeues
    env = {**_tools(tmp_path), "SLURM_JOB_NODELIST": "node-[a-b]", "SLURM_JOB_NUM_NODES": "2"}
    code, err, calls = _run(build, SERVE_SBATCH_SH, tmp_path, env, str(build), "--max-num-seqs", "4")
    assert code == 0, err
    (srun,) = calls
    assert srun["prog"] == "srun" and "--nodes=2" in srun["argv"] and "--ntasks-per-node=1" in srun["argv"]
    assert "--output=serve-%x-%j-node%n.log" in srun["argv"]
    task = srun["argv"][srun["argv"].index("-c") + 1 :]
    # each task: node 0 runs head.sh, the others worker.sh with their node rank (run here as Slurm would)
    for node, expected in (("0", "head"), ("1", "worker")):
        probe = subprocess.run(
            ["bash", "-c", task[0].replace("exec bash", "exec echo"), *task[1:]],
            env={**env, "SLURM_NODEID": node, "BUILD_DIR": str(build), "LMSPEC_HEAD_ADDRESS": "node-a"},
            capture_output=True,
            text=True,
            check=True,
        )
        assert probe.stdout.split() == [
            str(build / f"serve/{expected}.sh"),
            "node-a",
            *(["1"] if expected == "worker" else []),
            "--max-num-seqs",
            "4",
        ]


def test_one_node_sbatch_runs_serve_sh(tmp_path: Path) -> None:
    _, build = _compile(tmp_path, ["cluster.launcher=slurm"])
    text = (build / SERVE_SBATCH_SH).read_text()
    assert "#SBATCH --nodes=1" in text and 'bash "$BUILD_DIR/serve/serve.sh"' in text
    assert f'source "$BUILD_DIR/{NCCL_ENV}"' in text


def _hydra_quoted(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


@pytest.mark.parametrize("overrides", [DP2, RAY, MP], ids=["data-parallel", "ray", "mp"])
def test_hostile_values_stay_data_and_shellcheck_is_clean(
    tmp_path: Path, shellcheck: str, overrides: list[str]
) -> None:
    hostile = str(tmp_path / 'it\'s a $(touch pwned) `x` "dir"')
    _, build = _compile(tmp_path, [*overrides, f"serve.model_path={_hydra_quoted(hostile)}", "cluster.launcher=slurm"])
    for script in (SERVE_HEAD_SH, SERVE_WORKER_SH, SERVE_SBATCH_SH):
        check = subprocess.run([shellcheck, str(build / script)], capture_output=True, text=True, check=False)
        assert check.returncode == 0, f"{script}:\n{check.stdout}"
    _model(tmp_path, hostile)
    env = _tools(tmp_path)
    code, err, calls = _run(build, SERVE_HEAD_SH, tmp_path, env, HEAD)
    assert code == 0, err
    assert not list(tmp_path.rglob("pwned"))


def test_report_and_plan_carry_each_roles_numbers_and_the_serving_performance(tmp_path: Path) -> None:
    from lmspec.compiler.build.reader import Build

    plan, build = _compile(tmp_path, [*DP4, "serve.model_path=models/tiny"])
    numbers = plan.served().numbers
    assert [(r.role, r.nodes, r.gpus_per_node, r.dp_ranks_per_node) for r in numbers.roles] == [
        ("head", (0,), 2, 2),
        ("worker", (1,), 2, 2),
    ]
    report = (build / "REPORT.md").read_text()
    memory = plan.served().memory
    assert (
        f"| node role worker (node 1) | 2 GPU(s) used per node; 2 engine(s): {2 * memory.max_tokens_in_cache:,} tokens"
        in report
    )
    assert "on node 0 `bash build/tiny/serve/head.sh HEAD_ADDRESS`" in report
    assert "lmspec run build/tiny --stage serve` (" not in report  # no one-node command for a 2-node engine
    perf = plan.served().perf
    assert perf.engines == 4  # dp 4: vLLM runs each data-parallel rank as an engine
    assert 0 < perf.running_per_engine <= perf.capacity_per_engine
    assert perf.output_tokens_per_s == pytest.approx(perf.requests_per_s * 128, rel=1e-6)  # 128 out a request
    assert (
        f"| requests in each engine | {perf.running_per_engine:.3g} of at most {perf.capacity_per_engine:,}" in report
    )
    document = json.loads((build / "plan.json").read_text())
    assert document["serve"]["perf"] == perf_dict(perf)
    assert Build.open(build).plan.served().numbers == numbers  # plan.json round-trips


def test_an_engine_across_rack_hosts_stays_in_one_nvlink_domain(tmp_path: Path) -> None:
    """TP 8 on GB200 NVL72's 4-GPU hosts: two hosts of one rack, which Slurm's topology/block packs as one
    segment, and NCCL reaches over multi-node NVLink."""
    _, build = _compile(
        tmp_path,
        ["--spec", "llama3_70b_serve_8gpu_h100_bf16", "hardware=gb200_nvl72", "hardware.nodes=2", "serve.host=0.0.0.0"]
        + ["serve.api_key_env=null", "cluster.launcher=slurm"],
    )
    lines = (build / SERVE_SBATCH_SH).read_text().splitlines()
    assert "#SBATCH --nodes=2" in lines and "#SBATCH --segment=2" in lines
    assert "export NCCL_MNNVL_ENABLE=1" in (build / NCCL_ENV).read_text().splitlines()
