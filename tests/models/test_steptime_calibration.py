"""The step-time model against its calibration set (issue 21's targets, and issue 39's for the MoE points, on
the Ampere and Hopper runs they were set for; issue 42's Blackwell and CDNA runs scored per generation): the
committed constants are the fit, and the published runs are priced within the errors the issues allow, also
when each source is left out of the fit. bench/steptime_published.py prints the per-point table these numbers
come from."""

from __future__ import annotations

import json
import statistics
from types import ModuleType

import pytest
import yaml
from helpers.bench import bench_module

from lmspec.compiler.models.steptime_calibration import CALIBRATION

pytestmark = pytest.mark.slow  # composes 73 jobs and runs 20 staged least-squares fits (~30 s)

MEDIAN_ERROR = 0.10
HOPPER_MEDIAN_ERROR = 0.12
LEAVE_ONE_SOURCE_OUT_MEDIAN_ERROR = 0.12
WORST_ERROR = 0.35
# issue 39: the MoE points, and the dense points no worse than before the MoE terms
MOE_MEDIAN_ERROR = 0.12
MOE_LEAVE_ONE_SOURCE_OUT_MEDIAN_ERROR = 0.15
MOE_WORST_ERROR = 0.40
DENSE_MEDIAN_ERROR = 0.03
DENSE_LEAVE_ONE_SOURCE_OUT_MEDIAN_ERROR = 0.07
# issue 42: each new generation's median and leave-one-source-out median error, guarded a little above what its
# first fit reached (Blackwell 10.2% and 10.3%, held back by launch-bound MoE points whose CUDA graphs lmspec
# cannot key; CDNA 2.6% and 4.6%)
GENERATION_ERRORS = {"Blackwell": (0.13, 0.14), "CDNA": (0.06, 0.07)}


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return bench_module("steptime_published")


@pytest.fixture(scope="module")
def points(bench: ModuleType) -> list:
    raw = yaml.safe_load(bench.DATA.read_text(encoding="utf-8"))["points"]
    composed = [bench.compose(p) for p in raw]
    assert all(p.inputs is not None for p in composed), [p.reason for p in composed if p.inputs is None]
    return composed


@pytest.fixture(scope="module")
def held_out(bench: ModuleType, points: list) -> dict[str, float]:
    return bench.leave_one_source_out(points)


@pytest.fixture(scope="module")
def earlier(bench: ModuleType, points: list) -> list:
    """The Ampere and Hopper points: those issues 21 and 39 set their targets on."""
    return [p for p in points if p.generation in bench.SHARED_BY]


def _errors(points: list, calibration=CALIBRATION) -> list[float]:
    return [abs(p.ratio(calibration) - 1) for p in points]


def test_the_committed_calibration_is_the_fit_of_the_set(bench: ModuleType, points: list) -> None:
    assert bench.fit(points) == CALIBRATION, "refit: .venv/bin/python bench/steptime_published.py --fit"


def test_published_runs_are_priced_within_the_issue_targets(earlier: list) -> None:
    errors = _errors(earlier)
    hopper = _errors([p for p in earlier if p.generation == "Hopper"])
    assert statistics.median(errors) <= MEDIAN_ERROR
    assert statistics.median(hopper) <= HOPPER_MEDIAN_ERROR
    worst = max(earlier, key=lambda p: abs(p.ratio(CALIBRATION) - 1))
    assert max(errors) <= WORST_ERROR, (worst.point["id"], worst.ratio(CALIBRATION))


def test_the_calibration_file_is_what_the_fit_writes(bench: ModuleType, points: list, held_out: dict) -> None:
    """steptime_calibration.json's provenance (data, points, errors) is the committed fit's, not an older one's."""
    written = json.loads(bench.CALIBRATION_PATH.read_text(encoding="utf-8"))
    assert written == bench.calibration_document(CALIBRATION, points, bench.DATA, held_out), (
        "refit: .venv/bin/python bench/steptime_published.py --fit"
    )


def test_each_source_is_predicted_by_the_others(points: list, earlier: list, held_out: dict) -> None:
    """The score of prediction, not of fitting: every source priced with constants fitted without it."""
    assert len(held_out) == len(points)
    assert statistics.median(held_out[str(p.point["id"])] for p in earlier) <= LEAVE_ONE_SOURCE_OUT_MEDIAN_ERROR


@pytest.mark.parametrize("generation", GENERATION_ERRORS)
def test_each_new_generation_is_priced_and_predicted(points: list, held_out: dict, generation: str) -> None:
    """Blackwell and CDNA: their own constants fitted on their runs, each source also priced without its own."""
    rows = [p for p in points if p.generation == generation]
    median, held = GENERATION_ERRORS[generation]
    assert len({p.source for p in rows}) >= 2
    assert statistics.median(_errors(rows)) <= median
    assert statistics.median(held_out[str(p.point["id"])] for p in rows) <= held


def test_moe_points_are_priced_within_issue_39s_targets(earlier: list, held_out: dict) -> None:
    """Dispatch, imbalance, grouped GEMMs and launch-bound layers: the MoE points within 12% at the median,
    15% when their source is left out, none beyond 40%."""
    moe = [p for p in earlier if p.moe]
    assert len(moe) >= 8
    errors = _errors(moe)
    assert statistics.median(errors) <= MOE_MEDIAN_ERROR
    assert statistics.median(held_out[str(p.point["id"])] for p in moe) <= MOE_LEAVE_ONE_SOURCE_OUT_MEDIAN_ERROR
    worst = max(moe, key=lambda p: abs(p.ratio(CALIBRATION) - 1))
    assert max(errors) <= MOE_WORST_ERROR, (worst.point["id"], worst.ratio(CALIBRATION))


def test_dense_points_keep_their_accuracy(earlier: list, held_out: dict) -> None:
    dense = [p for p in earlier if not p.moe]
    assert statistics.median(_errors(dense)) <= DENSE_MEDIAN_ERROR
    assert statistics.median(held_out[str(p.point["id"])] for p in dense) <= DENSE_LEAVE_ONE_SOURCE_OUT_MEDIAN_ERROR
