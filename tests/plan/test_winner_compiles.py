"""The command `lmspec plan` prints for its winner compiles as printed, with no error and no communication
warning of lmspec's own (issue 39, item 5): the search ranks layouts that warning flags below every other
(they stay counted and shown), and a serving part the job never set is dropped (`serve=null`) where it
does not compile, so a training layout is never printed as a command that fails."""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers.cli import CliResult

from lmspec.compiler.cli.plan import _base_spec
from lmspec.compiler.models.summary import comm_over_warning
from lmspec.compiler.search.search import search

Lmspec = Callable[..., CliResult]
DEEPSEEK = "specs/deepseek_v3_pretrain_2048gpu_h800_bf16.yaml"
# the all-to-alls exposed: megatron-core refuses the shared-expert overlap beside parallel.overlap.moe_a2a
NO_A2A_OVERLAP = ("hardware.nodes=32", "train.moe.shared_expert_overlap=true")
MIXTRAL = "specs/mixtral_8x7b_pretrain_64gpu_h100_bf16.yaml"
COMM_WARNING = "of compute time (> 30%)"


def _plan(lmspec: Lmspec, *args: str) -> dict:
    result = lmspec("plan", *args, "--top", "2", "--format", "json")
    assert result.code == 0, result.err
    return json.loads(result.out)


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(("--spec", DEEPSEEK, "hardware.nodes=128"), id="deepseek_v3-1024-h800"),
        pytest.param(("--spec", MIXTRAL), id="mixtral-64-h100"),
        pytest.param(("model=deepseek_v3", "hardware=h800_80g", "hardware.nodes=128"), id="deepseek_v3-default-serve"),
        pytest.param(("model=deepseek_v3", "hardware=gb200_nvl72", "hardware.nodes=32"), id="deepseek_v3-gb200-nvl72"),
    ],
)
def test_the_printed_winner_of_a_moe_job_compiles_without_error_or_communication_warning(
    lmspec: Lmspec, tmp_path: Path, args: tuple[str, ...]
) -> None:
    data = _plan(lmspec, *args)
    winner = data["top"][0]
    assert not winner["communication_warning"] and winner["exposed_comm_to_compute"] <= 0.30
    assert data["winner_problems"] == [] or all(not p.startswith("error") for p in data["winner_problems"])
    words = shlex.split(data["winner_command"])
    assert words[:2] == ["lmspec", "compile"]
    built = lmspec(*words[1:], "-o", str(tmp_path))
    assert built.code == 0, built.err
    assert "error:" not in built.err and COMM_WARNING not in built.err, built.err


def test_a_serving_part_the_job_never_set_is_dropped_where_it_does_not_compile(lmspec: Lmspec) -> None:
    data = _plan(lmspec, "model=deepseek_v3", "hardware=h800_80g", "hardware.nodes=128")
    assert data["winner_command"].endswith(" serve=null")
    assert len(data["winner_notes"]) == 1 and "serving does not fit" in data["winner_notes"][0]


def test_a_serving_part_the_job_set_is_kept(lmspec: Lmspec) -> None:
    data = _plan(lmspec, "--spec", DEEPSEEK, "hardware.nodes=128")
    assert "serve=null" not in data["winner_command"] and data["winner_notes"] == []


def test_layouts_the_communication_warning_flags_rank_below_the_rest_and_are_counted(lmspec: Lmspec) -> None:
    """DeepSeek-V3 on 256 H800 without overlapped all-to-alls (the shared-expert overlap rules the searched
    parallel.overlap.moe_a2a out): layouts of exposed all-to-alls are kept and counted, and rank below every
    layout the warning does not flag, however fast the step-time model prices them."""
    import argparse

    spec, _ = _base_spec(argparse.Namespace(overrides=[*NO_A2A_OVERLAP], spec=Path(DEEPSEEK)))
    result = search(spec, [spec.hardware.nodes], ["megatron", "deepspeed"], "throughput", 5)
    flagged = comm_over_warning(result.priced.time)
    assert (result.flagged == flagged).all() and 0 < result.warned < result.feasible
    assert not result.flagged[result.ranked].any()  # the top of the ranking: unflagged layouts, while any fit
    shown = lmspec("plan", "--spec", DEEPSEEK, *NO_A2A_OVERLAP, "--top", "1")
    assert f"{result.warned:,} of the {result.feasible:,} layouts that fit" in shown.out


def test_plan_s_flag_is_the_warning_s_condition(lmspec: Lmspec) -> None:
    """The fastest flagged layout, compiled as plan would print it, draws the communication warning."""
    data = _plan(lmspec, "--spec", DEEPSEEK, *NO_A2A_OVERLAP)
    fastest = data["fastest_warned"]
    assert fastest is not None and fastest["share_of_winner"] > 1 and fastest["exposed_comm_to_compute"] > 0.30
