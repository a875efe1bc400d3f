"""The hardware presets of issue 42 hold their vendors' published figures: every number of each preset
equals its row in tests/data/hardware/datasheets.yaml (which names the document and what it states), every
number has a row, each preset has exactly the keys the older presets have, and each compiles a job through
lmspec's own path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers.paths import ROOT

from lmspec.compiler.paths import SPECS_DIR
from lmspec.compiler.pipeline import make_plan
from lmspec.compiler.spec.load import compose_spec

DATA = ROOT / "tests" / "data" / "hardware" / "datasheets.yaml"
HARDWARE_DIR = SPECS_DIR / "hardware"
PRESETS = (
    "b200_180g",
    "b300_288g",
    "gb200_nvl72",
    "gb300_nvl72",
    "h20_96g",
    "mi300x_192g",
    "mi325x_256g",
    "mi355x_288g",
)
# Numbers of a preset that are not a datasheet's: the job's node count, and the share of the peaks sustained
# (1.0: no vendor states lower clocks for these parts).
NOT_FROM_A_DATASHEET = {"nodes": 1, "gpu.sustained_fraction": 1.0}
EXPECTED_GENERATION_AND_LINK = {
    "b200_180g": ("blackwell", "nvlink5"),
    "b300_288g": ("blackwell", "nvlink5"),
    "gb200_nvl72": ("blackwell", "nvlink5"),
    "gb300_nvl72": ("blackwell", "nvlink5"),
    "h20_96g": ("hopper", "nvlink"),
    "mi300x_192g": ("cdna3", "xgmi"),
    "mi325x_256g": ("cdna3", "xgmi"),
    "mi355x_288g": ("cdna4", "xgmi"),
}

DATASHEETS = yaml.safe_load(DATA.read_text(encoding="utf-8"))
ROWS: list[dict[str, Any]] = DATASHEETS["rows"]


def _leaves(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """`{"gpu.memory_gib": 180, ...}`: every leaf of a nested mapping by its dotted key path."""
    out: dict[str, Any] = {}
    for name, value in tree.items():
        path = f"{prefix}{name}"
        out.update(_leaves(value, f"{path}.") if isinstance(value, dict) else {path: value})
    return out


def _numbers(preset: str) -> dict[str, float]:
    """The preset's numbers as lmspec composes it (`hardware=<preset>`), nulls left out."""
    hardware = compose_spec([f"hardware={preset}"]).spec["hardware"]
    return {
        path: value
        for path, value in _leaves(hardware).items()
        if isinstance(value, int | float) and not isinstance(value, bool)
    }


def _file_keys(path: Path) -> set[str]:
    return set(_leaves(yaml.safe_load(path.read_text(encoding="utf-8"))))


def test_every_row_names_a_listed_source_and_says_what_it_states() -> None:
    sources = DATASHEETS["sources"]
    assert {row["preset"] for row in ROWS} == set(PRESETS)
    for row in ROWS:
        assert row["source"] in sources, row
        assert row["quote"] and row["unit"], row
    keys = [(row["preset"], row["key"]) for row in ROWS]
    assert len(keys) == len(set(keys)), "a preset key has two rows"


@pytest.mark.parametrize("preset", PRESETS)
def test_preset_has_exactly_the_keys_of_h100(preset: str) -> None:
    assert _file_keys(HARDWARE_DIR / f"{preset}.yaml") == _file_keys(HARDWARE_DIR / "h100_80g.yaml")


@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_number_equals_its_datasheet_row(preset: str) -> None:
    numbers = _numbers(preset)
    rows = {row["key"]: row["value"] for row in ROWS if row["preset"] == preset}
    from_datasheets = {k: v for k, v in numbers.items() if k not in NOT_FROM_A_DATASHEET}
    assert from_datasheets == rows
    assert {k: numbers[k] for k in NOT_FROM_A_DATASHEET} == NOT_FROM_A_DATASHEET


@pytest.mark.parametrize("preset", PRESETS)
def test_preset_generation_link_and_domain(preset: str) -> None:
    hardware = compose_spec([f"hardware={preset}"]).spec["hardware"]
    assert (hardware["gpu"]["generation"], hardware["intra_node"]["link"]) == EXPECTED_GENERATION_AND_LINK[preset]
    rack = preset.endswith("_nvl72")
    assert hardware["gpus_per_node"] == (4 if rack else 8)
    assert hardware["nvlink_domain"] == (72 if rack else None)
    assert (hardware["gpu"]["fp4_tflops"] is None) == (hardware["gpu"]["generation"] in ("hopper", "cdna3"))


@pytest.mark.parametrize("preset", PRESETS)
def test_llama3_8b_compiles_on_one_node_of_each_preset(preset: str) -> None:
    plan = make_plan(["model=llama3_8b", f"hardware={preset}", "parallel.distributed_optimizer=true"])
    gpus = plan.spec.hardware.gpus_per_node
    assert plan.spec.hardware.name == preset
    assert plan.spec.hardware.gpu.memory_gib == _numbers(preset)["gpu.memory_gib"]
    assert plan.trained().layout.dp == gpus
    assert plan.spec.serve is not None and plan.spec.serve.tp == plan.served().layout.gpus == gpus
