"""`lmspec plan` from the command line: table, JSON, plot, written spec, usage errors."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from helpers.cli import CliResult
from helpers.paths import ROOT

LLAMA_70B = ["model=llama3_70b", "hardware=h100_80g"]
Lmspec = Callable[..., CliResult]


def test_table_names_the_winner_and_what_each_rule_rejected(lmspec: Lmspec) -> None:
    result = lmspec("plan", *LLAMA_70B, "hardware.nodes=8", "--top", "3")
    assert result.code == 0, result.err
    assert "llama3_70b on H100-SXM5-80GB" in result.out
    assert "layout.world_size_matches" in result.out and "memory budget" in result.out
    winner = next(line for line in result.out.splitlines() if line.startswith("winner: lmspec compile "))
    args = shlex.split(winner.removeprefix("winner: lmspec compile "))
    assert "hardware.nodes=8" in args and "parallel.dp=auto" in args
    checked = lmspec("check", *args)
    assert checked.code == 0, checked.err
    assert "valid (trains on 64 ranks" in checked.out


def test_json_accounts_for_every_candidate(lmspec: Lmspec) -> None:
    result = lmspec("plan", *LLAMA_70B, "--gpus", "32..64", "--top", "5", "--format", "json")
    assert result.code == 0, result.err
    data = json.loads(result.out)
    assert data["gpus"] == [32, 40, 48, 56, 64]
    rejected_by_rules = sum(n for rule, n in data["rejected"].items() if not rule.startswith("memory budget"))
    assert rejected_by_rules + data["legal_candidates"] == data["raw_candidates"]
    budget = next(n for rule, n in data["rejected"].items() if rule.startswith("memory budget"))
    assert budget + data["feasible_candidates"] == data["legal_candidates"]
    top = data["top"]
    assert [row["rank"] for row in top] == [1, 2, 3, 4, 5]
    assert all(a["tokens_per_s"] >= b["tokens_per_s"] for a, b in zip(top, top[1:]))
    assert all(row["memory_bytes"] <= data["budget_bytes"] for row in top)
    assert data["step_time_constants"]["CALIBRATION"]["hopper_gemm"] > 0
    assert data["winner_command"].startswith("lmspec compile ")


def test_objectives_change_the_order(lmspec: Lmspec) -> None:
    runs = {
        objective: json.loads(
            lmspec(
                "plan", *LLAMA_70B, "--gpus", "32..64", "--top", "3", "--format", "json", "--objective", objective
            ).out
        )["top"]
        for objective in ("throughput", "cost", "min-gpus")
    }
    assert runs["min-gpus"][0]["gpus"] == 32
    assert runs["throughput"][0]["tokens_per_s"] >= runs["cost"][0]["tokens_per_s"]
    per_gpu = {k: v[0]["tokens_per_s"] / v[0]["gpus"] for k, v in runs.items()}
    assert per_gpu["cost"] >= max(per_gpu.values())


def test_written_spec_compiles_unchanged(lmspec: Lmspec, tmp_path: Path) -> None:
    target = tmp_path / "experiment" / "llama70b_planned.yaml"
    result = lmspec(
        "plan", *LLAMA_70B, "hardware.nodes=8", "train.global_batch_size=512", "--top", "1", "--write", str(target)
    )
    assert result.code == 0, result.err
    text = target.read_text(encoding="utf-8")
    data = yaml.safe_load(text)
    assert data["defaults"][-1] == "_self_" and {"model": "llama3_70b"} in data["defaults"]
    assert data["name"] == "llama70b_planned" and data["train"]["global_batch_size"] == 512
    built = lmspec("compile", "--spec", str(target), "-o", str(tmp_path / "build"))
    assert built.code == 0, built.err
    plan = json.loads((tmp_path / "build" / "llama70b_planned" / "plan.json").read_text(encoding="utf-8"))
    assert plan["layout"]["world_size"] == 64
    assert plan["layout"]["tp"] == data["parallel"]["tp"]


def test_plot_is_an_svg(lmspec: Lmspec, tmp_path: Path) -> None:
    plot = tmp_path / "pareto.svg"
    result = lmspec("plan", "model=llama3_8b", "hardware=h100_80g", "--gpus", "8..16", "--plot", str(plot))
    assert result.code == 0, result.err
    assert plot.read_text(encoding="utf-8").lstrip().startswith("<?xml")
    assert "Pareto front" in plot.read_text(encoding="utf-8")


def test_spec_problems_outside_the_layout_are_reported_and_block_writing(lmspec: Lmspec, tmp_path: Path) -> None:
    """A serving part the job set (here serve.max_model_len) that cannot hold 671B on one node: the plan says
    so, and --write refuses; plan does not rewrite serving the user asked for."""
    args = (
        "plan",
        "model=deepseek_v3",
        "hardware=h800_80g",
        "hardware.nodes=256",
        "train.global_batch_size=15360",
        "serve.max_model_len=4096",
        "--top",
        "1",
    )
    shown = lmspec(*args)
    assert shown.code == 0 and "serving does not fit" in shown.err
    written = lmspec(*args, "--write", str(tmp_path / "dsv3.yaml"))
    assert written.code == 1 and "serving does not fit" in written.err
    assert not (tmp_path / "dsv3.yaml").exists()


def test_a_default_serving_part_that_does_not_fit_is_dropped_from_the_winner(lmspec: Lmspec, tmp_path: Path) -> None:
    """The same job with lmspec's default serve group, which it never set: the command and the written spec
    carry serve=null, and a note says what was dropped."""
    args = ("plan", "model=deepseek_v3", "hardware=h800_80g", "hardware.nodes=256", "train.global_batch_size=15360")
    shown = lmspec(*args, "--top", "1")
    assert shown.code == 0 and "error:" not in shown.err
    assert "note: serve=null added" in shown.out and shown.out.rstrip().endswith(" serve=null")
    target = tmp_path / "dsv3.yaml"
    written = lmspec(*args, "--top", "1", "--write", str(target))
    assert written.code == 0, written.err
    assert yaml.safe_load(target.read_text(encoding="utf-8"))["serve"] is None


def test_nothing_fits_names_the_fewest_gpus(lmspec: Lmspec) -> None:
    result = lmspec("plan", "model=deepseek_v3", "hardware=a100_80g", "--gpus", "32")
    assert result.code == 1
    assert "no layout of deepseek_v3 fits on 32 x A100-SXM4-80GB" in result.err
    assert "training fits from " in result.err and "hardware.nodes=" in result.err


def test_usage_errors(lmspec: Lmspec, tmp_path: Path) -> None:
    cases = [
        (("--gpus", "12"), "--gpus 12 is not whole nodes"),
        (("--gpus", "4..6"), "holds no whole node"),
        (("--gpus", "lots"), "expected N, LOW..HIGH"),
        (("hardware.nodes=2", "--gpus", "16"), "not both"),
        (("--top", "0"), "--top 0"),
        (("--write", str(tmp_path / "bad name.yaml")), "--write"),
        (("--plot", str(tmp_path / "plot.pdf")), "--plot"),
    ]
    for extra, expected in cases:
        result = lmspec("plan", "model=llama3_8b", "hardware=h100_80g", *extra)
        assert result.code == 2, (extra, result.err)
        assert expected in result.err and "Traceback" not in result.err


def test_check_does_not_import_numpy() -> None:
    code = (
        "import sys\nfrom lmspec.compiler.cli.main import run\nassert run(['check']) == 0\n"
        "assert 'numpy' not in sys.modules, 'lmspec check imported numpy'\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, capture_output=True, timeout=120)


def test_the_specs_own_layout_is_ranked(lmspec: Lmspec) -> None:
    result = lmspec("plan", "--spec", "llama3_70b_pretrain_64gpu_h100_bf16", "--top", "2", "--format", "json")
    assert result.code == 0, result.err
    data = json.loads(result.out)
    assert data["current_layout"].startswith("the spec's own layout (TP8 PP2 CP1 EP1 SP, megatron")
    assert " ranks #" in data["current_layout"]
    assert data["winner_command"].startswith("lmspec compile --spec llama3_70b_pretrain_64gpu_h100_bf16 ")


def test_moe_preset_on_cpu_plans(lmspec: Lmspec) -> None:
    """The MoE CPU preset: routed-expert activations added to an integer array of sharded ones (was a numpy
    casting error)."""
    result = lmspec("plan", "--spec", "tiny_moe_pretrain_2rank_cpu_fp32", "--top", "2")
    assert result.code == 0, result.err
    assert "winner: lmspec compile --spec tiny_moe_pretrain_2rank_cpu_fp32" in result.out


def test_no_two_rows_differ_only_in_a_setting_that_changes_nothing(lmspec: Lmspec) -> None:
    """At dp x cp = 1 a sharded optimizer (Megatron's distributed optimizer, ZeRO) shards nothing: the
    row would be the unsharded one again, as sequence parallel is at tp 1. 16 GPUs of Llama 3 70B
    fit only at TP8 PP2 DP1, where both used to be listed."""
    data = json.loads(lmspec("plan", *LLAMA_70B, "--gpus", "16..32", "--top", "100", "--format", "json").out)
    assert data["rejected"]["layout.sharding_needs_data_parallel"] > 0
    seen: dict[str, dict[str, object]] = {}
    for row in data["top"]:
        sharded = row["parallel.distributed_optimizer"] or row["parallel.zero_stage"] > 0
        assert not sharded or row["dp"] * row["parallel.cp"] > 1, row["overrides"]
        ignored = {"rank", "why", "overrides", "parallel.distributed_optimizer"}
        same = json.dumps({k: v for k, v in row.items() if k not in ignored}, sort_keys=True)
        assert same not in seen, (row["overrides"], seen.get(same))
        seen[same] = row
    assert any(row["dp"] == 1 for row in data["top"])


def test_check_warns_of_a_sharded_optimizer_with_nothing_to_shard(lmspec: Lmspec) -> None:
    args = [*LLAMA_70B, "hardware.nodes=2", "parallel.tp=8", "parallel.pp=2", "parallel.sequence_parallel=true"]
    result = lmspec("check", *args, "parallel.distributed_optimizer=true", "train.recompute=full")
    assert "warning: parallel.distributed_optimizer=true (command-line override) has no effect" in result.err
    assert "dp x cp = 1" in result.err and "set parallel.distributed_optimizer=false" in result.err


def test_plan_interleaves_a_short_pipeline_and_explain_prices_it_alike(lmspec: Lmspec) -> None:
    """64 H100s of Llama 3 70B at 64 sequences a step on the Megatron backend: eight micro-batches per
    pipeline leave plain 1F1B idle (pp - 1) of them; plan's winner interleaves, its overrides pass check, and
    explain's estimate of the same spec is the step time plan ranked it by (one computation). (Over every
    backend, torchtitan's FSDP2 with per-op checkpointing ranks 1.1% ahead: no pipeline at all.)"""
    job = [*LLAMA_70B, "hardware.nodes=8", "train.global_batch_size=64"]
    result = lmspec("plan", *job, "--backend", "megatron", "--top", "1", "--format", "json")
    assert result.code == 0, result.err
    winner = json.loads(result.out)["top"][0]
    v = winner["parallel.virtual_stages"]
    assert v is not None and v > 1 and winner["parallel.pp"] > 1
    assert f"parallel.virtual_stages={v}" in winner["overrides"]
    assert lmspec("check", *job, *winner["overrides"]).code == 0
    explained = json.loads(lmspec("explain", *job, *winner["overrides"], "--format", "json").out)
    assert explained["throughput"]["step_time_s"] == pytest.approx(winner["step_time_s"], rel=1e-5)
    assert explained["throughput"]["terms"]["bubble_s"] == pytest.approx(winner["terms_s"]["bubble"], rel=1e-4)
