"""bench/gpu_check.sh, the prepared GPU check: shellcheck-clean, and its CPU dry mode compiles every
variant and prints the table of estimates; without Transformer Engine its variants take the local path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.paths import ROOT

SCRIPT = ROOT / "bench" / "gpu_check.sh"
DRIVER = ROOT / "bench" / "gpu_check.py"
ALL = ["tp1_bf16", "tp1_fp8_delayed", "tp1_fp8_blockwise", "tp2_sp_bf16", "pp2_bf16", "cp2_bf16", "dp2_distopt_bf16"]


def _driver(*args: str) -> str:
    done = subprocess.run([sys.executable, str(DRIVER), *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_script_is_shellcheck_clean(shellcheck: str) -> None:
    done = subprocess.run([shellcheck, "--format=gcc", str(SCRIPT)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout


@pytest.mark.slow
def test_dry_run_prints_every_variants_estimates(tmp_path: Path) -> None:
    env = {**os.environ, "LMSPEC_PYTHON": sys.executable}
    done = subprocess.run(
        ["bash", str(SCRIPT), "--dry-run", "--work", str(tmp_path / "work")],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    rows = [line.split(" | ") for line in done.stdout.splitlines() if line.startswith("| ") and "---" not in line]
    assert [r[0].removeprefix("| ") for r in rows[1:]] == ALL
    for r in rows[1:]:
        assert r[2] == "transformer_engine" and float(r[4]) > 0 and float(r[6]) > 0  # the Plan's estimates
        assert r[5] == "-" and r[7] == "-" and r[8] == "compiled |"  # nothing measured in a dry run
    assert "| tp1_fp8_blockwise | tp1 pp1 cp1 dp1 | transformer_engine | fp8/blockwise |" in done.stdout
    assert "| cp2_bf16 | tp1 pp1 cp2 dp1 |" in done.stdout


def test_without_transformer_engine_the_variants_are_the_local_paths(tmp_path: Path) -> None:
    assert _driver("variants", "--gpus", "1").split() == ["tp1_bf16"]
    assert _driver("variants", "--gpus", "2").split() == ["tp1_bf16", "tp2_sp_bf16", "pp2_bf16", "dp2_distopt_bf16"]
    assert _driver("variants", "--gpus", "8", "--te", "--fp8").split() == ALL
    _driver("compile", "--hardware", "h100_80g", "--work", str(tmp_path), "tp2_sp_bf16")
    (row,) = json.loads(_driver("table", "--work", str(tmp_path), "--json"))
    assert (row["variant"], row["impl"], row["layout"], row["peak_gib"]) == (
        "tp2_sp_bf16",
        "local",
        "tp2 pp1 cp1 dp1",
        None,
    )
