"""The calibration set of published training runs (tests/data/steptime/published_runs.yaml) is well formed,
every figure converts to tokens/s per GPU the way its `conversion` line says, and bench/steptime_published.py
prices a sample of it through lmspec's own API."""

from __future__ import annotations

import re
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
# A100 dense, H100 dense, MoE, Blackwell (an NVL72 rack of 4-GPU trays), CDNA
SAMPLE = (
    "megatron21_gpt_18b",
    "megatron24_gpt_70b",
    "mcore_mixtral_8x7b_64gpu",
    "mbridge2511_llama3_8b_8gpu_gb200_tensorwise",
    "mlperf51_llama31_8b_8gpu_mi355x_fp8_amd",
)
GENERATIONS = ("Ampere", "Hopper", "Blackwell", "CDNA")


def _data() -> dict[str, Any]:
    return dict(yaml.safe_load(DATA.read_text(encoding="utf-8")))


def _gpus_per_node(preset: str) -> int:
    hardware = yaml.safe_load((ROOT / "specs" / "hardware" / f"{preset}.yaml").read_text(encoding="utf-8"))
    return int(hardware["gpus_per_node"])


POINTS = list(_data()["points"])


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
    assert point["gpus"] % _gpus_per_node(point["hardware"]) == 0
    assert all(key in point["layout"] for key in LAYOUT_KEYS)


@pytest.mark.parametrize("point", [p for p in POINTS if "flops_per_token" in p], ids=lambda p: p["id"])
def test_flop_figures_convert_by_their_flop_count(point: dict[str, Any]) -> None:
    """tokens/s per GPU = published FLOP/s per GPU / FLOPs per token (MFU points: times the bf16 peak)."""
    unit, value = point["published_unit"], point["published_value"]
    flops_per_s = {"TFLOP/s per GPU": value * 1e12, "MFU": value * 312e12}[unit]
    assert point["tokens_per_s_per_gpu"] == pytest.approx(flops_per_s / point["flops_per_token"], rel=1e-3)


def test_every_source_is_cited_and_used() -> None:
    """Each source record names where its figures are, and some point draws on it."""
    sources = _data()["sources"]
    used = {p["source"]["name"] for p in POINTS}
    for name, source in sources.items():
        assert source["name"] == name
        assert source["url"].startswith("https://") and source["table"] and source["notes"]
    assert used == set(sources)


def test_blackwell_and_cdna_points_span_several_sources() -> None:
    """Each new generation is scored by more than one source, so leave-one-source-out has something to say."""
    generation = {p["id"]: _generation(p["hardware"]) for p in POINTS}
    blackwell = {p["source"]["name"] for p in POINTS if generation[p["id"]] == "blackwell"}
    cdna = {p["source"]["name"] for p in POINTS if generation[p["id"]] in ("cdna3", "cdna4")}
    assert sum(g == "blackwell" for g in generation.values()) >= 8
    assert len(blackwell) >= 2 and len(cdna) >= 2


def _generation(preset: str) -> str:
    hardware = yaml.safe_load((ROOT / "specs" / "hardware" / f"{preset}.yaml").read_text(encoding="utf-8"))
    return str(hardware["gpu"]["generation"])


STEP_UNIT = re.compile(r"seconds per step \((\d+) x (\d+) tokens, (\d+) GPUs\)")
SAMPLE_UNIT = re.compile(r"samples \((\d+)-token sequences\) per second, (\d+) GPUs")


@pytest.mark.parametrize(
    "point",
    [p for p in POINTS if STEP_UNIT.fullmatch(p["published_unit"]) or SAMPLE_UNIT.fullmatch(p["published_unit"])],
    ids=lambda p: p["id"],
)
def test_step_and_sample_figures_convert_by_their_batch(point: dict[str, Any]) -> None:
    """MLPerf logs: tokens/s per GPU = sequences x sequence length / step seconds / GPUs, or samples per second
    x sequence length / GPUs, with the batch, length and GPUs the unit names (and the point's own)."""
    value = point["published_value"]
    if step := STEP_UNIT.fullmatch(point["published_unit"]):
        sequences, length, gpus = (int(g) for g in step.groups())
        assert sequences == point["layout"]["train.global_batch_size"]
        expected = sequences * length / value / gpus
    else:
        sample = SAMPLE_UNIT.fullmatch(point["published_unit"])
        assert sample is not None
        length, gpus = (int(g) for g in sample.groups())
        expected = value * length / gpus
    assert length == point["layout"]["train.seq_length"] and gpus == point["gpus"]
    assert point["tokens_per_s_per_gpu"] == pytest.approx(expected, rel=1e-4)


def test_the_bench_prices_a_sample() -> None:
    result = subprocess.run(
        [sys.executable, str(BENCH), "--only", *SAMPLE], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert all(point_id in out for point_id in SAMPLE)
    assert "not priced" not in out
    assert "median absolute error" in out
    assert all(f"  {generation} " in out for generation in GENERATIONS)
