"""report/memory.svg a reviewer can read: each bar's total on it, the worst stage marked, the y axis fitted to
the bars with the usable limit shown without squashing them, and a colour-blind-safe palette."""

from __future__ import annotations

import dataclasses
from functools import cache
from pathlib import Path

from lmspec.compiler.emit.memory_chart import (
    COLORS,
    HEADROOM,
    ChartData,
    axis_top,
    memory_chart_svg,
)
from lmspec.compiler.pipeline import make_plan
from lmspec.compiler.plan import Plan

DEEPSEEK = "deepseek_v3_pretrain_2048gpu_h800_bf16"
MIXTRAL = "mixtral_8x7b_pretrain_64gpu_h100_bf16"
OKABE_ITO = {"#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7", "#000000"}


@cache
def _plan(spec: str | None) -> Plan:
    return make_plan([], Path(spec) if spec else None)


def test_deepseek_v3_bars_fill_the_axis_and_the_far_usable_limit_is_an_off_scale_note() -> None:
    data = ChartData.of(_plan(DEEPSEEK))
    assert data.unit == "GiB" and len(data.stage_labels) == 16
    assert data.worst == 0  # the first stage: 4 layers, the embedding and the most micro-batches in flight
    top, in_scale = axis_top(data)
    assert not in_scale and top == max(data.totals) * HEADROOM < data.budget == 79.0  # 80 GiB minus 1 GiB
    svg = memory_chart_svg(data)
    assert "usable 79.00 GiB per GPU: off scale, 2.9x the worst stage" in svg  # 79 / 27.71
    assert "27.71" in svg and "18.28" in svg  # every bar's total, two decimals as REPORT.md's table
    assert svg.count("worst") >= 1


def test_a_near_usable_limit_is_drawn_as_a_line_on_the_axis() -> None:
    data = ChartData.of(_plan(MIXTRAL))
    top, in_scale = axis_top(data)
    assert in_scale and top >= data.budget > max(data.totals)
    svg = memory_chart_svg(data)
    assert "usable 79.00 GiB" in svg and "off scale" not in svg
    assert "51.53" in svg  # the worst stage's total, stage 0


def test_the_tiny_cpu_chart_is_in_mib() -> None:
    data = ChartData.of(_plan(None))
    assert data.unit == "MiB" and data.stage_labels == ["every GPU"]
    assert data.budget == 7 * 1024  # 8 GiB minus the 1 GiB reserve, in MiB
    svg = memory_chart_svg(data)
    assert "MiB per GPU" in svg and "off scale" in svg


def test_the_palette_is_okabe_ito_without_red_or_green() -> None:
    assert set(COLORS.values()) <= OKABE_ITO
    assert "#009E73" not in COLORS.values() and "#D55E00" not in COLORS.values()  # no green, no vermillion
    svg = memory_chart_svg(ChartData.of(_plan(None)))
    assert all(color.lower() in svg.lower() for color in COLORS.values())


def test_the_drawing_style_is_in_the_key_so_an_old_chart_is_redrawn() -> None:
    data = ChartData.of(_plan(None))
    assert dataclasses.replace(data, style="1").key() != data.key()
