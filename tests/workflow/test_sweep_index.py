"""`lmspec compile -m`: one build per combination, plus an index comparing them."""

from __future__ import annotations

import json
from pathlib import Path

from lmspec.compiler.build.compare import key_numbers


def test_sweep_writes_an_index_with_every_combination(lmspec, tmp_path: Path) -> None:
    result = lmspec("compile", "-m", "-o", str(tmp_path), "parallel.tp=1,2,4", "train.steps=5")
    assert result.code == 1  # tp=4 does not fit 2 CPU ranks: reported, the others still built
    index = (tmp_path / "tiny-sweep.md").read_text()
    assert index.startswith("# Sweep: parallel.tp=1,2,4\n") and "2 of 3 combinations valid" in index
    rows = [line for line in index.splitlines() if line.startswith("| [") or "(invalid)" in line]
    assert len(rows) == 3
    for tp, row in zip((1, 2), rows):
        build = tmp_path / f"tiny-parallel.tp={tp}"
        numbers = key_numbers(json.loads((build / "plan.json").read_text()))
        assert row.startswith(f"| [tiny-parallel.tp={tp}](<tiny-parallel.tp={tp}/REPORT.md>) |")
        assert f"| {numbers['tp x pp x dp x ep']} |" in row and f"| {numbers['memory/GPU']} |" in row
    assert rows[2].startswith("| (invalid) | parallel.tp=4 |") and "error: parallel." in rows[2]
    manifest = json.loads((tmp_path / "tiny-parallel.tp=2" / "manifest.json").read_text())
    assert manifest["overrides"] == ["parallel.tp=2", "train.steps=5"]


def test_sweep_check_covers_the_index(lmspec, tmp_path: Path) -> None:
    args = ["-o", str(tmp_path), "parallel.tp=1,2"]
    assert lmspec("compile", "-m", *args).code == 0
    assert lmspec("compile", "-m", "--check", *args).code == 0
    index = tmp_path / "tiny-sweep.md"
    index.write_text(index.read_text().replace("valid", "VALID"))
    result = lmspec("compile", "-m", "--check", *args)
    assert result.code == 1 and f"{index}: stale" in result.out
