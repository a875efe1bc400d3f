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
    assert {"throughput.step_time_s", "throughput.terms.dp_comm_s", "throughput.mfu", "comm.dp_s"} <= numbers.keys()


def test_json_has_spec_origins_and_derived_numbers(lmspec) -> None:
    result = lmspec("explain", "--format", "json", "model=tiny_moe", "parallel.ep=2")
    assert result.code == 0, result.err
    doc = json.loads(result.out)
    assert doc["spec"]["model"]["moe"]["num_experts"] == 8
    assert doc["origins"]["parallel.ep"] == "command-line override"
    assert doc["layout"]["ep"] == 2 and doc["layout"]["expert_dp"] == 1
    assert doc["batch"]["grad_accum_steps"] == 2
    step = doc["throughput"]
    assert step["step_time_s"] == pytest.approx(sum(step["terms"].values()), rel=1e-5)
    gpus = doc["layout"]["world_size"]
    assert step["tokens_per_s"] == pytest.approx(doc["batch"]["tokens_per_step"] / step["step_time_s"], rel=1e-5)
    assert step["tokens_per_s_per_gpu"] == pytest.approx(step["tokens_per_s"] / gpus, rel=1e-5)
    # the communication warning and plan.json's comm weigh the estimated step's compute, not another one
    assert doc["comm"]["compute_s"] == pytest.approx(step["terms"]["compute_s"], rel=1e-5)


# (overrides, the error's key, a fragment of stderr, the derived parts present; None = the part is null or absent)
BROKEN = [
    pytest.param(
        ["model=deepseek_v3"],
        "hardware.gpu.memory_gib",
        "training does not fit",
        {"params", "layout", "memory", "flops", "comm", "throughput"},
        id="deepseek-v3-on-the-cpu-preset",
    ),
    pytest.param(
        ["parallel.tp=3"],
        "parallel.dp",
        "does not divide the world size",
        {"params"},
        id="a-layout-that-does-not-divide",
    ),
    pytest.param(
        ["train.micro_batch_size=0"],
        "train.micro_batch_size",
        "expected an integer >= 1",
        set(),
        id="a-value-the-schema-refuses",
    ),
]


@pytest.mark.parametrize(("overrides", "key", "fragment", "parts"), BROKEN)
def test_explain_answers_a_spec_that_breaks_a_rule(lmspec, overrides, key, fragment, parts) -> None:
    """Exit 1 for the error, but the whole document: the resolved spec, every number the spec still
    gives, and (JSON) the problems with their keys."""
    text = lmspec("explain", *overrides)
    assert text.code == 1 and fragment in text.err
    assert "model.num_layers" in text.out and "\nderived:\n" in text.out
    document = lmspec("explain", "--format", "json", *overrides)
    assert document.code == 1
    doc = json.loads(document.out)
    assert {"spec", "origins", "problems"} <= doc.keys()
    assert {"severity": "error", "key": key} in [{k: p[k] for k in ("severity", "key")} for p in doc["problems"]]
    assert all(fragment in p["message"] for p in doc["problems"] if p["key"] == key)
    present = {part for part in ("params", "layout", "memory", "flops", "comm", "throughput") if doc.get(part)}
    assert present == parts
    assert doc["origins"]["model.num_layers"].startswith("lmspec:specs/model/")


def test_explain_of_deepseek_v3_gives_its_size_on_any_hardware(lmspec) -> None:
    """The tutorial's first command: 671 B parameters, 37 B active (DeepSeek-V3 report), though the
    default CPU preset cannot hold it."""
    doc = json.loads(lmspec("explain", "--format", "json", "model=deepseek_v3").out)
    assert doc["params"]["total"] == pytest.approx(671e9, rel=0.001)
    assert doc["params"]["active"] == pytest.approx(37e9, rel=0.02)
    assert not doc["memory"]["fits"] and doc["memory"]["total_bytes"] > doc["memory"]["budget_bytes"]
