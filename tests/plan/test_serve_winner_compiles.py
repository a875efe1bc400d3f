"""The command `lmspec plan --serve` prints for its winner compiles as printed, with no error, and the build it
makes prices the winner as the plan did (plan.json's serve.perf is serve_perf of the same spec): for each
shipped serving spec, one under an SLO, and one whose winner is a pair of disaggregated pools."""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from helpers.cli import CliResult

Lmspec = Callable[..., CliResult]
POOLS_WIN = (  # two nodes and a tight TPOT target: the decode pool's steps carry no prompt chunks
    "hardware.nodes=2",
    "serve.host=0.0.0.0",
    "serve.slo={ttft_ms: 2000, tpot_ms: 20, percentile: 90}",
    "serve.workload.request_rate=10",
)


@pytest.mark.parametrize(
    ("args", "disaggregated"),
    [
        pytest.param(("--spec", "deepseek_v3_serve_16gpu_h100_fp8"), False, id="deepseek_v3-16-h100"),
        pytest.param(
            ("--spec", "deepseek_v3_serve_8gpu_h200_fp8", "serve.slo={ttft_ms: 2000, tpot_ms: 100, percentile: 90}"),
            False,
            id="deepseek_v3-8-h200-slo",
        ),
        pytest.param(("--spec", "llama3_70b_serve_8gpu_h100_bf16"), False, id="llama3_70b-8-h100"),
        pytest.param(("--spec", "llama3_70b_serve_8gpu_h100_bf16", *POOLS_WIN), True, id="llama3_70b-pools"),
    ],
)
def test_the_printed_serving_winner_compiles_and_its_build_prices_it_alike(
    lmspec: Lmspec, tmp_path: Path, args: tuple[str, ...], disaggregated: bool
) -> None:
    result = lmspec("plan", "--serve", *args, "--top", "2", "--format", "json")
    assert result.code == 0, result.err
    data = json.loads(result.out)
    winner = data["top"][0]
    assert data["winner_problems"] == []
    assert (winner["serve.disaggregation"] is not None) == disaggregated
    words = shlex.split(data["winner_command"])
    assert words[:2] == ["lmspec", "compile"] and words[-len(winner["overrides"]) :] == winner["overrides"]
    built = lmspec(*words[1:], "-o", str(tmp_path))
    assert built.code == 0, built.err
    assert "error:" not in built.err, built.err
    (plan_json,) = tmp_path.glob("*/plan.json")
    perf = json.loads(plan_json.read_text(encoding="utf-8"))["serve"]["perf"]
    assert perf["goodput_requests_per_s"] == winner["goodput_requests_per_s"] > 0
    assert perf["tpot_ms"] == winner["tpot_ms"]


def test_the_written_serving_spec_compiles_unchanged(lmspec: Lmspec, tmp_path: Path) -> None:
    target = tmp_path / "experiment" / "deepseek_planned.yaml"
    args = ("plan", "--spec", "deepseek_v3_serve_8gpu_h200_fp8", "--top", "1")
    result = lmspec(*args, "--write", str(target))
    assert result.code == 0, result.err
    winner = json.loads(lmspec(*args, "--format", "json").out)["top"][0]
    built = lmspec("compile", "--spec", str(target), "-o", str(tmp_path / "build"))
    assert built.code == 0, built.err
    build = tmp_path / "build" / "deepseek_planned"
    serve = yaml.safe_load((build / "spec.resolved.yaml").read_text(encoding="utf-8"))["serve"]
    assert all(serve[key.removeprefix("serve.")] == winner[key] for key in ("serve.tp", "serve.pp", "serve.dp"))
    plan = json.loads((build / "plan.json").read_text(encoding="utf-8"))
    assert plan["serve"]["perf"]["goodput_requests_per_s"] == winner["goodput_requests_per_s"]
