"""The calibration set of published training runs (tests/data/steptime/published_runs.yaml) is well formed,
every figure converts to tokens/s per GPU the way its `conversion` line says, and bench/steptime_published.py
prices a sample of it through lmspec's own API."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
import yaml
from helpers.paths import ROOT

DATA = ROOT / "tests" / "data" / "steptime" / "published_runs.yaml"
BENCH = ROOT / "bench" / "steptime_published.py"
MIN_POINTS = 20
LAYOUT_KEYS = ("train.seq_length", "train.micro_batch_size", "train.global_batch_size", "train.precision")
SAMPLE = ("megatron21_gpt_18b", "megatron24_gpt_70b", "mcore_mixtral_8x7b_64gpu")  # A100 dense, H100 dense, MoE


def _points() -> list[dict[str, Any]]:
    return list(yaml.safe_load(DATA.read_text(encoding="utf-8"))["points"])


POINTS = _points()


def test_the_set_is_large_enough_and_ids_are_unique() -> None:
    ids = [p["id"] for p in POINTS]
    assert len(ids) >= MIN_POINTS
    assert len(set(ids)) == len(ids)
    assert sum(p["layout"]["train.precision"] == "bf16" for p in POINTS) >= MIN_POINTS


@pytest.mark.parametrize("point", POINTS, ids=[p["id"] for p in POINTS])
def test_every_point_names_its_source_figure_and_conversion(point: dict[str, Any]) -> None:
    assert point["source"]["url"].startswith("https://")
    assert point["source"]["table"] and point["row"]
    assert point["published"] and point["published_unit"]
    assert point["conversion"].strip()
    assert point["tokens_per_s_per_gpu"] > 0
    assert (ROOT / "specs" / "hardware" / f"{point['hardware']}.yaml").is_file()
    preset = point["model"] if isinstance(point["model"], str) else point["model"]["preset"]
    assert (ROOT / "specs" / "model" / f"{preset}.yaml").is_file()
    assert point["gpus"] % 8 == 0
    assert all(key in point["layout"] for key in LAYOUT_KEYS)


@pytest.mark.parametrize("point", [p for p in POINTS if "flops_per_token" in p], ids=lambda p: p["id"])
def test_flop_figures_convert_by_their_flop_count(point: dict[str, Any]) -> None:
    """tokens/s per GPU = published FLOP/s per GPU / FLOPs per token (MFU points: times the bf16 peak)."""
    unit, value = point["published_unit"], point["published_value"]
    flops_per_s = {"TFLOP/s per GPU": value * 1e12, "MFU": value * 312e12}[unit]
    assert point["tokens_per_s_per_gpu"] == pytest.approx(flops_per_s / point["flops_per_token"], rel=1e-3)


def test_the_bench_prices_a_sample() -> None:
    result = subprocess.run(
        [sys.executable, str(BENCH), "--only", *SAMPLE], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert all(point_id in out for point_id in SAMPLE)
    assert "not priced" not in out
    assert "median absolute error" in out
