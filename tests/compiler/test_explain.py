"""`lmspec explain`: provenance of every leaf, and the JSON document other tools read."""

from __future__ import annotations

import json

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
    rows = {line.split()[0]: line for line in result.out.splitlines() if line and not line.startswith(" ")}
    expected_line = _line_of(SPECS_DIR / "model" / "llama3_70b.yaml", "num_layers")
    assert rows["model.num_layers"].endswith(f"# lmspec:specs/model/llama3_70b.yaml:{expected_line}")
    assert rows["parallel.tp"].endswith("# command-line override")
    assert "80" in rows["model.num_layers"]


def test_json_has_spec_origins_and_derived_numbers(lmspec) -> None:
    result = lmspec("explain", "--format", "json", "model=tiny_moe", "parallel.ep=2")
    assert result.code == 0, result.err
    doc = json.loads(result.out)
    assert doc["spec"]["model"]["moe"]["num_experts"] == 8
    assert doc["origins"]["parallel.ep"] == "command-line override"
    assert doc["layout"]["ep"] == 2 and doc["layout"]["expert_dp"] == 1
    assert doc["batch"]["grad_accum_steps"] == 2
