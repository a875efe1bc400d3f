"""`lmspec explain`: provenance of every leaf, and the JSON document other tools read."""

from __future__ import annotations

import json

import pytest

from lmspec.compiler.paths import SPECS_DIR


def _line_of(path, key: str) -> int:
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if line.startswith(f"{key}:"):
            return number
    raise AssertionError(f"{key} not in {path}")


def test_text_shows_file_and_line_and_overrides(lmspec) -> None:
    result = lmspec(
        "explain",
        "model=llama3_70b",
        "parallel.tp=2",
        "hardware=h100_80g",
        "hardware.nodes=8",
        "parallel.pp=4",
        "parallel.distributed_optimizer=true",
        "train.recompute=full",
    )
    assert result.code == 0, result.err
    text, derived = result.out.split("\nderived:\n", 1)
    rows = {}
    for line in text.splitlines():
        if line:
            key, rest = line.split(maxsplit=1)
            value, origin = rest.split("  # ", 1)
            rows[key] = (value.strip(), origin)
    expected_line = _line_of(SPECS_DIR / "model" / "llama3_70b.yaml", "num_layers")
    assert rows["model.num_layers"] == ("80", f"lmspec:specs/model/llama3_70b.yaml:{expected_line}")
    assert rows["parallel.tp"] == ("2", "command-line override")
    assert rows["hardware.nodes"] == ("8", "command-line override")
    numbers = dict(line.split(maxsplit=1) for line in derived.split("\n\n", 1)[0].splitlines())
    assert numbers["layout.world_size"] == "64" and numbers["layout.dp"] == "8"  # 64 / (tp 2 x pp 4)
    assert numbers["layout.stage_layers"] == "[20, 20, 20, 20]"
    assert numbers["batch.grad_accum_steps"] == "128"  # global 1024 / (micro 1 x dp 8)
    assert {"step_time.total_s", "step_time.dp_comm_s", "comm.dp_s"} <= numbers.keys()


def test_json_has_spec_origins_and_derived_numbers(lmspec) -> None:
    result = lmspec("explain", "--format", "json", "model=tiny_moe", "parallel.ep=2")
    assert result.code == 0, result.err
    doc = json.loads(result.out)
    assert doc["spec"]["model"]["moe"]["num_experts"] == 8
    assert doc["origins"]["parallel.ep"] == "command-line override"
    assert doc["layout"]["ep"] == 2 and doc["layout"]["expert_dp"] == 1
    assert doc["batch"]["grad_accum_steps"] == 2
    step = doc["step_time"]
    assert step["total_s"] == pytest.approx(sum(v for k, v in step.items() if k != "total_s"), rel=1e-5)
