"""`lmspec diff`: two builds, or the spec at a git revision against the working tree."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.team_repo import set_tp

from lmspec.compiler.build.compare import arrow, format_value, key_numbers
from lmspec.compiler.cli.init import STARTER_SPEC

SPEC_ARG = f"specs/{STARTER_SPEC}.yaml"


def _two_tiny_builds(lmspec, tmp_path: Path) -> tuple[Path, Path]:
    for tp in (1, 2):
        assert lmspec("compile", "-o", str(tmp_path / f"tp{tp}"), f"parallel.tp={tp}").code == 0
    return tmp_path / "tp1" / "tiny", tmp_path / "tp2" / "tiny"


def test_diff_of_two_builds_names_the_spec_change_and_the_numbers(lmspec, tmp_path: Path) -> None:
    a, b = _two_tiny_builds(lmspec, tmp_path)
    result = lmspec("diff", str(a), str(b))
    assert result.code == 0, result.err
    headline = result.out.splitlines()[1]
    assert headline.startswith("parallel.tp 1→2: ")
    old, new = (key_numbers(json.loads((d / "plan.json").read_text())) for d in (a, b))
    assert old["tp x pp x dp x ep"] != new["tp x pp x dp x ep"]
    for label in old:
        if old[label] != new[label]:
            assert f"{label} {arrow(old[label], new[label])}" in headline
    assert "  M plan.json" in result.out and "  M manifest.json" in result.out
    assert f"--- {a}/plan.json" in result.out and '-    "tp": 1,' in result.out and '+    "tp": 2,' in result.out
    assert f"--- {a}/manifest.json" not in result.out  # hashes only: listed, not diffed
    stat = lmspec("diff", "--stat", str(a), str(b))
    assert stat.out.splitlines()[1] == headline and "@@" not in stat.out


def test_diff_of_identical_builds(lmspec, tmp_path: Path) -> None:
    a, _ = _two_tiny_builds(lmspec, tmp_path)
    result = lmspec("diff", str(a), str(a))
    assert result.code == 0 and result.out.strip().endswith("identical")


def test_diff_against_a_git_revision(team_repo: Path, lmspec, monkeypatch) -> None:
    monkeypatch.chdir(team_repo)
    assert lmspec("diff", "--against", "HEAD", "--spec", SPEC_ARG).out.strip().endswith("identical")
    set_tp(team_repo, 4)
    result = lmspec("diff", "--against", "HEAD", "--spec", SPEC_ARG)
    assert result.code == 0, result.err
    assert result.out.splitlines()[1].startswith("parallel.tp 2→4: ")
    assert "memory/GPU" in result.out.splitlines()[1]
    assert f"--- {STARTER_SPEC}@HEAD/spec.resolved.yaml" in result.out
    # The same override on both sides cancels out; a different one shows up.
    assert "hardware.nodes" not in lmspec("diff", "--against", "HEAD", "--spec", SPEC_ARG, "hardware.nodes=4").out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["build/only_one"], "diff takes two build directories"),
        (["{tmp}/nope", "{tmp}/nope"], "not a build directory"),
        (["--against", "no-such-rev", "--spec", SPEC_ARG], "git rev-parse"),
    ],
    ids=["one-build", "missing-build", "bad-revision"],
)
def test_diff_usage_errors(team_repo: Path, lmspec, monkeypatch, tmp_path: Path, argv: list[str], message: str) -> None:
    monkeypatch.chdir(team_repo)
    result = lmspec("diff", *[a.format(tmp=tmp_path) for a in argv])
    assert result.code == 2 and message in result.err and "Traceback" not in result.err


def test_diff_against_a_revision_without_the_spec(team_repo: Path, lmspec, monkeypatch) -> None:
    monkeypatch.chdir(team_repo)
    new = Path("specs/new_job.yaml")
    new.write_text(Path(SPEC_ARG).read_text().replace(f"name: {STARTER_SPEC}", "name: new_job"))
    result = lmspec("diff", "--against", "HEAD", "--spec", str(new))
    assert result.code == 2 and "does not exist at HEAD" in result.err


def test_values_read_as_a_reviewer_reads_them() -> None:
    assert format_value("memory.total_bytes", 41.2 * 2**30) == "41.2 GiB"
    assert format_value("memory.per_gpu.weights_bytes", 512 * 2**20) == "512.0 MiB"
    assert format_value("comm.share_of_step", 0.31) == "31%"
    assert format_value("comm.ratio_to_compute", 0.884) == "88%"
    assert format_value("batch.tokens_per_step", 4194304) == "4,194,304"
    assert arrow("41.2 GiB", "20.6 GiB") == "41.2→20.6 GiB"
    assert arrow("2 x 1 x 8 x 1", "4 x 1 x 4 x 1") == "2 x 1 x 8 x 1→4 x 1 x 4 x 1"


def test_comm_over_the_warning_line_is_flagged() -> None:
    """The line is weighed against what the step leaves exposed, as the communication warning weighs it."""
    plan = {"comm": {"ratio_to_compute": 0.9, "exposed_ratio_to_compute": 0.31, "warning_ratio": 0.3}}
    assert key_numbers(plan)["exposed comm/compute"] == "31% (over the 30% line)"
    plan["comm"]["exposed_ratio_to_compute"] = 0.12  # overlap hides the rest of the 90%
    assert key_numbers(plan)["exposed comm/compute"] == "12%"
