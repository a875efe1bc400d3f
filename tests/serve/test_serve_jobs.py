"""`lmspec run` on the three kinds of job, and the multi-node and Slurm serve stage; no vLLM starts here.

A serve-only build (train: null) serves by default and refuses every training stage naming the one
that works; a train-only build (serve: null) refuses --stage serve; a multi-node engine prints each
node's command and starts nothing; cluster=slurm's serve stage is `sbatch serve/sbatch.sh BUILD`
(shown by --dry-run: the training Slurm tests run a real local Slurm, not a fake sbatch). The
explain/doctor/logs commands read a serve-only build without a training part.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers.build import compile_build
from helpers.cli import CliResult
from helpers.paths import LOG_DATA, ROOT

from lmspec.compiler.build.reader import Build
from lmspec.compiler.families import FAMILIES

SERVE_ONLY = ("train=null", "parallel=null", "convert=null", "serve.model_path=models/tiny", "serve.max_model_len=128")
TWO_NODES = ROOT / "specs" / "deepseek_v3_serve_16gpu_h100_fp8.yaml"
TRAINING_STAGES = ("train", "import", "convert", "verify")
Lmspec = Callable[..., CliResult]


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("jobs")
    return {
        "serve_only": compile_build(root / "serve_only", SERVE_ONLY).dir,
        "train_only": compile_build(root / "train_only", ["serve=null"]).dir,
        "two_nodes": compile_build(root / "two_nodes", spec=TWO_NODES).dir,
        "two_nodes_slurm": compile_build(root / "two_nodes_slurm", ["cluster=slurm"], spec=TWO_NODES).dir,
        "one_node_slurm": compile_build(root / "one_node_slurm", ["cluster=slurm", *SERVE_ONLY]).dir,
    }


@pytest.mark.parametrize("stage", TRAINING_STAGES)
def test_serve_only_build_refuses_training_stages_naming_the_serve_stage(
    stage: str, builds: dict[str, Path], lmspec: Lmspec
) -> None:
    build = builds["serve_only"]
    result = lmspec("run", str(build), "--stage", stage)
    result.assert_reports(2, [f"lmspec: error: {build} is a serve-only job (train: null)", "--stage serve`"])


def test_serve_only_build_serves_without_a_stage(builds: dict[str, Path], lmspec: Lmspec) -> None:
    build = builds["serve_only"]
    result = lmspec("run", str(build), "--dry-run")
    assert result.code == 0, result.err
    assert result.out.strip().endswith(shlex.join(["bash", str(build.resolve() / "serve" / "serve.sh")]))


def test_train_only_build_trains_by_default_and_refuses_to_serve(builds: dict[str, Path], lmspec: Lmspec) -> None:
    build = builds["train_only"]
    result = lmspec("run", str(build), "--stage", "serve")
    result.assert_reports(2, [f"lmspec: error: {build} is a train-only job (serve: null)"])
    result = lmspec("run", str(build), "--dry-run")
    assert result.code == 0 and "launch/torchrun.sh" in result.out


def test_run_help_says_what_each_stage_needs(lmspec: Lmspec, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        lmspec("run", "--help")
    text = " ".join(capsys.readouterr().out.split())
    for needs in (
        "train (a job that trains",
        "import (a job that trains",
        "convert (a job that trains and converts",
        "verify (a checkpoint",
        "serve (a serve section",
        "the default of a serve-only job",
    ):
        assert needs in text, needs


def test_multi_node_local_prints_each_node_s_command_and_starts_nothing(
    builds: dict[str, Path], lmspec: Lmspec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LMSPEC_VLLM", "vllm")
    build = builds["two_nodes"]
    result = lmspec("run", str(build), "--stage", "serve")
    assert result.code == 0, result.err
    serve = build.resolve() / "serve"
    assert f"  node 0 (head): LMSPEC_VLLM=vllm bash {serve / 'head.sh'} ADDRESS\n" in result.out
    assert f"  node 1 (worker): LMSPEC_VLLM=vllm bash {serve / 'worker.sh'} ADDRESS 1\n" in result.out
    assert "serves on 2 nodes (data_parallel, 16 GPUs" in result.out
    assert "from the directory that holds runs/" in result.out and "clients: http://ADDRESS:8000/v1" in result.out
    assert result.out.startswith("serve: no models/DeepSeek-V3/config.json on this machine")  # left to the nodes
    assert not (tmp_path / "runs").exists()  # nothing started, no log written
    assert lmspec("run", str(build), "--stage", "serve", "--dry-run").out == result.out.split("\n", 1)[1]


def test_multi_node_checks_the_served_model_where_it_is_here(
    builds: dict[str, Path], lmspec: Lmspec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    release = json.loads((ROOT / "tests" / "data" / "hf_configs" / "DeepSeek-V3.json").read_text())
    _write_config(tmp_path / "models" / "DeepSeek-V3", {**release, "num_hidden_layers": 60})
    result = lmspec("run", str(builds["two_nodes"]), "--stage", "serve")
    result.assert_reports(2, ["model.num_layers is 61 in the spec but 60 in models/DeepSeek-V3/config.json"])
    assert "node 0" not in result.out
    (tmp_path / "models" / "DeepSeek-V3" / "config.json").write_text(json.dumps(release))
    result = lmspec("run", str(builds["two_nodes"]), "--stage", "serve")
    result.assert_reports(2, ["models/DeepSeek-V3' has no tokenizer", "copy the model's tokenizer files into it"])
    (tmp_path / "models" / "DeepSeek-V3" / "tokenizer_config.json").write_text("{}")
    result = lmspec("run", str(builds["two_nodes"]), "--stage", "serve")
    assert result.code == 0 and result.out.startswith(str(builds["two_nodes"])), result.err


@pytest.mark.parametrize("kind", ["two_nodes_slurm", "one_node_slurm"])
def test_slurm_serve_stage_submits_serve_sbatch(
    kind: str, builds: dict[str, Path], lmspec: Lmspec, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LMSPEC_VLLM", "vllm")
    build = builds[kind].resolve()
    result = lmspec("run", str(build), "--stage", "serve", "--dry-run")
    assert result.code == 0, result.err
    assert result.out == f"LMSPEC_VLLM=vllm sbatch --parsable {build / 'serve' / 'sbatch.sh'} {build}\n"


def test_edited_node_script_is_refused_before_anything_runs(
    builds: dict[str, Path], lmspec: Lmspec, tmp_path_factory: pytest.TempPathFactory
) -> None:
    build = compile_build(tmp_path_factory.mktemp("edited"), spec=TWO_NODES).dir
    with (build / "serve" / "worker.sh").open("a") as script:
        script.write("echo edited\n")
    result = lmspec("run", str(build), "--stage", "serve")
    result.assert_reports(2, ["serve/worker.sh"])
    assert "node 0 (head)" not in result.out


def _write_config(directory: Path, config: dict) -> None:
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps(config))


def test_served_model_other_than_the_spec_s_is_refused_before_vllm(
    builds: dict[str, Path], lmspec: Lmspec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    config = json.loads((ROOT / "tests" / "data" / "hf_configs" / "Llama-3.1-8B.json").read_text())
    _write_config(tmp_path / "models" / "tiny", config)
    result = lmspec("run", str(builds["serve_only"]), "--stage", "serve", "--smoke")
    result.assert_reports(
        2,
        [
            "models/tiny/config.json is not what the spec serves (1 problem(s))",
            "model.num_layers is 4 in the spec but 32 in models/tiny/config.json",
            "lmspec import-model models/tiny -o specs/model/NAME.yaml",
        ],
    )
    assert not (tmp_path / "runs").exists()


def test_serve_only_model_needs_its_key_and_its_own_tokenizer(
    builds: dict[str, Path], lmspec: Lmspec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    model = Build.open(builds["serve_only"]).spec.model
    _write_config(tmp_path / "models" / "tiny", FAMILIES[model.family].hf_config(model))  # the spec's model
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    result = lmspec("run", str(builds["serve_only"]), "--stage", "serve", "--smoke")
    result.assert_reports(2, ["serve.api_key_env=VLLM_API_KEY"])
    monkeypatch.setenv("VLLM_API_KEY", "k")
    result = lmspec("run", str(builds["serve_only"]), "--stage", "serve", "--smoke")
    result.assert_reports(2, ["has no tokenizer", "a serve-only job has no training tokenizer"])


def test_explain_of_a_serve_only_spec_gives_serve_numbers_and_no_training_numbers(lmspec: Lmspec) -> None:
    text = lmspec("explain", *SERVE_ONLY)
    assert text.code == 0, text.err
    derived = text.out.split("\nderived:\n", 1)[1]
    assert "serve.max_concurrent_seqs" in derived and "serve.layout.mode" in derived
    parts = {line.split()[0].split(".")[0] for line in derived.splitlines() if line.startswith("  ")}
    assert parts == {"params", "serve"}  # no layout, batch, memory, flops, comm or throughput
    assert "training memory" not in derived
    document = json.loads(lmspec("explain", *SERVE_ONLY, "--format", "json").out)
    assert document["serve"]["max_concurrent_seqs"] > 0
    assert [document[part] for part in ("layout", "batch", "memory", "flops", "comm")] == [None] * 5


def test_explain_check_and_compile_of_a_train_only_spec(lmspec: Lmspec, tmp_path: Path) -> None:
    document = json.loads(lmspec("explain", "serve=null", "--format", "json").out)
    assert document["serve"] is None and document["layout"]["world_size"] >= 1
    assert "training memory per GPU" in lmspec("explain", "serve=null").out
    assert lmspec("check", "serve=null").code == 0
    assert lmspec("check", *SERVE_ONLY).code == 0
    assert lmspec("compile", "-o", str(tmp_path), "serve=null").code == 0


def test_doctor_reads_a_vllm_log_against_a_serve_only_build(builds: dict[str, Path], lmspec: Lmspec) -> None:
    for log in sorted(LOG_DATA.glob("*.log")):  # the training signatures skip a job that does not train
        result = lmspec("doctor", str(log), "--build", str(builds["serve_only"]))
        assert result.code in (0, 1) and "Traceback" not in result.err, (log.name, result.err)
    result = lmspec("doctor", str(LOG_DATA / "vllm_kv_cache_too_small.log"), "--build", str(builds["serve_only"]))
    assert result.code == 1 and "serve." in result.out


def test_logs_with_a_serve_only_build_says_what_it_reads(builds: dict[str, Path], lmspec: Lmspec) -> None:
    result = lmspec("logs", str(LOG_DATA / "healthy_lmspec_metrics.jsonl"), "--build", str(builds["serve_only"]))
    result.assert_reports(2, ["is a serve-only job (train: null)", "lmspec doctor LOG --build"])


def test_ray_engine_prints_the_order_the_nodes_start_in(
    lmspec: Lmspec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    ray = ["serve.multi_node=ray", "serve.dp=1", "serve.tp=8", "serve.pp=2", "serve.expert_parallel=false"]
    build = compile_build(tmp_path / "build", ray, spec=TWO_NODES).dir
    result = lmspec("run", str(build), "--stage", "serve", "--dry-run")
    assert result.code == 0, result.err
    assert "serves on 2 nodes (ray, 16 GPUs" in result.out and "start node 0 first" in result.out
    assert f"bash {build.resolve() / 'serve' / 'worker.sh'} ADDRESS 1\n" in result.out


def test_a_model_vllm_cannot_serve_on_cpu_is_refused_by_the_serve_stage(
    lmspec: Lmspec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tiny_moe trains on CPU, so compile only warns that its MLA latent is not the one vLLM's CPU kernel takes;
    the serve stage refuses it with that reason before anything starts."""
    monkeypatch.chdir(tmp_path)
    plan, build = compile_build(tmp_path / "build", spec="tiny_moe_pretrain_2rank_cpu_fp32")
    assert [w.key for w in plan.warnings] == ["model.mla.kv_lora_rank"]
    result = lmspec("run", str(build), "--stage", "serve", "--smoke")
    result.assert_reports(
        2, ["vLLM's CPU backend cannot serve this model", "vLLM's CPU MLA kernel supports only a latent of 576"]
    )
    assert not (tmp_path / "runs").exists()
