"""The memory chart is redrawn only when what it draws changed: the emitter
(compiler/emit/memory_chart.py) is a function of the Plan, and the writer
(compiler/build/writer.py) keeps the earlier build's chart when its key matches."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from lmspec.compiler.build.digest import sha256
from lmspec.compiler.build.files import MEMORY_CHART
from lmspec.compiler.cli.main import run
from lmspec.compiler.emit.manifest import build_files
from lmspec.compiler.emit.memory_chart import chart_key, drawn_key, emit_memory_chart
from lmspec.compiler.emit.spec_files import dump_json
from lmspec.compiler.pipeline import make_plan, plan_from
from lmspec.compiler.spec.load import compose_spec

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
    chart.write_text(original.replace("iB per GPU", "B per GPU"))  # same key, other bytes (GiB or MiB axis)
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


def test_the_writer_keeps_the_earlier_charts_bytes_and_the_emitter_draws_from_the_plan(tmp_path: Path) -> None:
    assert run(["compile", "-o", str(tmp_path)]) == 0
    build = tmp_path / "tiny"
    plan = make_plan([])
    drawn = emit_memory_chart(plan)[MEMORY_CHART]
    assert drawn_key(drawn) == chart_key(plan) and (build / MEMORY_CHART).read_text() == drawn
    # a chart drawn from the same numbers by another lmspec (same key, other bytes), recorded in the manifest
    earlier = drawn.replace("iB per GPU", "iB on each GPU")
    assert earlier != drawn
    (build / MEMORY_CHART).write_text(earlier)
    manifest = json.loads((build / "manifest.json").read_text())
    manifest["files"][MEMORY_CHART] = sha256(earlier)
    (build / "manifest.json").write_text(dump_json(manifest))
    assert build_files(plan_from(compose_spec([]), lambda name: tmp_path / name))[MEMORY_CHART] == earlier
    assert build_files(plan)[MEMORY_CHART] == drawn == emit_memory_chart(plan)[MEMORY_CHART]
    assert run(["compile", "--check", "-o", str(tmp_path)]) == 0  # kept, so the build on disk is up to date
