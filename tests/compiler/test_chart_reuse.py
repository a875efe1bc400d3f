"""The memory chart is redrawn only when what it draws changed (compiler/emit/memory_chart.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from lmspec.compiler.cli.main import run

CHART = Path("tiny") / "report" / "memory.svg"
PROBE = """
import json, sys
from lmspec.compiler.cli.main import run
code = run(sys.argv[1:])
print(json.dumps({"code": code, "matplotlib": "matplotlib" in sys.modules}))
"""


def _compile_in_fresh_process(*argv: str) -> dict:
    done = subprocess.run([sys.executable, "-c", PROBE, "compile", *argv], capture_output=True, text=True, timeout=120)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_rebuild_with_the_same_memory_keeps_the_chart_without_importing_matplotlib(tmp_path: Path) -> None:
    assert _compile_in_fresh_process("-o", str(tmp_path)) == {"code": 0, "matplotlib": True}
    first = (tmp_path / CHART).read_bytes()
    # train.lr moves no memory figure: every other artifact is re-emitted, the chart is kept
    assert _compile_in_fresh_process("-o", str(tmp_path), "train.optimizer.lr=0.002") == {
        "code": 0,
        "matplotlib": False,
    }
    assert (tmp_path / CHART).read_bytes() == first
    assert "0.002" in (tmp_path / "tiny" / "spec.resolved.yaml").read_text()


def test_a_memory_change_redraws_the_chart(tmp_path: Path) -> None:
    assert run(["compile", "-o", str(tmp_path)]) == 0
    first = (tmp_path / CHART).read_text()
    assert run(["compile", "-o", str(tmp_path), "train.micro_batch_size=2"]) == 0
    redrawn = (tmp_path / CHART).read_text()
    assert redrawn != first
    assert run(["compile", "-o", str(tmp_path)]) == 0
    assert (tmp_path / CHART).read_text() == first  # drawing is deterministic


def test_a_hand_edited_chart_is_redrawn_and_check_reports_it(tmp_path: Path, capsys) -> None:
    assert run(["compile", "-o", str(tmp_path)]) == 0
    chart = tmp_path / CHART
    original = chart.read_text()
    chart.write_text(original.replace("GiB per GPU", "GB per GPU"))  # same key, other bytes
    assert run(["compile", "--check", "-o", str(tmp_path)]) == 1
    assert "report/memory.svg (changed)" in capsys.readouterr().err
    assert run(["compile", "-o", str(tmp_path)]) == 0
    assert chart.read_text() == original


def test_a_first_build_and_a_rebuild_are_byte_identical(tmp_path: Path) -> None:
    assert run(["compile", "-o", str(tmp_path / "a")]) == 0
    assert run(["compile", "-o", str(tmp_path / "a")]) == 0
    assert run(["compile", "-o", str(tmp_path / "b")]) == 0
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*") if p.is_file())
    assert files and all((tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes() for f in files)
