"""The build directory: byte-identical recompiles, atomic replacement, drift detection, sweeps."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lmspec.compiler.build.digest import sha256
from lmspec.compiler.build.writer import write_build
from lmspec.compiler.emit.manifest import build_files
from lmspec.compiler.pipeline import make_plan

DEEPSEEK = [
    "model=deepseek_v3",
    "hardware=h800_80g",
    "hardware.nodes=256",
    "parallel.pp=16",
    "parallel.ep=64",
    "parallel.pp_layout=auto",
    "parallel.distributed_optimizer=true",
    "train.recompute=full",
    "serve.pp=3",
    "serve.host=0.0.0.0",  # the engine spans 3 nodes
]  # what lmspec's memory budget asks for this layout


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("overrides", [[], DEEPSEEK], ids=["tiny", "deepseek_v3"])
def test_compiling_twice_is_byte_identical(lmspec, tmp_path: Path, overrides: list[str]) -> None:
    assert lmspec("compile", "-o", str(tmp_path / "a"), *overrides).code == 0
    assert lmspec("compile", "-o", str(tmp_path / "b"), *overrides).code == 0
    a, b = _tree(tmp_path / "a"), _tree(tmp_path / "b")
    assert a and a == b


def test_manifest_records_version_overrides_and_every_file(lmspec, tmp_path: Path) -> None:
    assert lmspec("compile", "-o", str(tmp_path), "train.steps=7").code == 0
    build = tmp_path / "tiny"
    manifest = json.loads((build / "manifest.json").read_text())
    assert manifest["overrides"] == ["train.steps=7"]
    assert manifest["lmspec_version"]
    assert manifest["spec_sha256"] == sha256((build / "spec.resolved.yaml").read_text())
    on_disk = {p.relative_to(build).as_posix() for p in build.rglob("*") if p.is_file()} - {"manifest.json"}
    assert set(manifest["files"]) == on_disk
    for rel, digest in manifest["files"].items():
        assert sha256((build / rel).read_text()) == digest


def test_failed_write_leaves_previous_build_intact(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "tiny"
    write_build(target, build_files(make_plan([])))
    before = _tree(target)
    calls = {"n": 0}
    real_fsync = os.fsync

    def failing_fsync(fd: int) -> None:  # the disk fails on the second file
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError(28, "No space left on device")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", failing_fsync)
    from lmspec.compiler.errors import UsageError

    with pytest.raises(UsageError, match="No space left on device"):
        write_build(target, build_files(make_plan(["train.steps=99"])))
    assert _tree(target) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny"], "a temp dir was left behind"


def test_check_detects_drift_and_passes_when_fresh(lmspec, tmp_path: Path) -> None:
    out = str(tmp_path)
    assert lmspec("compile", "-o", out).code == 0
    assert lmspec("compile", "--check", "-o", out).code == 0
    (tmp_path / "tiny" / "REPORT.md").write_text("edited by hand\n")
    (tmp_path / "tiny" / "leftover.txt").write_text("x\n")
    result = lmspec("compile", "--check", "-o", out)
    assert result.code == 1
    assert "REPORT.md (changed)" in result.err and "leftover.txt (not emitted)" in result.err
    stale = lmspec("compile", "--check", "-o", out, "train.steps=5")
    assert stale.code == 1 and "spec.resolved.yaml (changed)" in stale.err
    refused = lmspec("compile", "-o", out)  # a file lmspec did not write is never deleted: refused, named
    refused.assert_reports(2, ["tiny exists and is not an lmspec build", "leftover.txt", "manifest.json does not name"])
    assert (tmp_path / "tiny" / "leftover.txt").read_text() == "x\n"
    (tmp_path / "tiny" / "leftover.txt").unlink()
    assert lmspec("compile", "-o", out).code == 0  # the hand-edited REPORT.md is lmspec's file: replaced
    assert lmspec("compile", "--check", "-o", out).code == 0


def test_check_on_missing_build_lists_missing_files(lmspec, tmp_path: Path) -> None:
    result = lmspec("compile", "--check", "-o", str(tmp_path))
    assert result.code == 1 and "spec.resolved.yaml (missing)" in result.err


def test_multirun_compiles_one_build_per_combination(lmspec, tmp_path: Path) -> None:
    result = lmspec("compile", "-m", "-o", str(tmp_path), "parallel.tp=1,2", "train.steps=5")
    assert result.code == 0, result.err
    names = sorted(p.name for p in tmp_path.iterdir() if p.is_dir())
    assert names == ["tiny-parallel.tp=1", "tiny-parallel.tp=2"]
    plan = json.loads((tmp_path / "tiny-parallel.tp=2" / "plan.json").read_text())
    assert plan["layout"]["tp"] == 2 and plan["layout"]["dp"] == 1


def test_resolved_spec_compiles_back_to_itself(lmspec, tmp_path: Path) -> None:
    assert lmspec("compile", "-o", str(tmp_path / "a"), "model=tiny_moe", "parallel.ep=2").code == 0
    resolved = tmp_path / "a" / "tiny_moe" / "spec.resolved.yaml"
    assert lmspec("compile", "--spec", str(resolved), "-o", str(tmp_path / "b")).code == 0
    assert (tmp_path / "b" / "tiny_moe" / "spec.resolved.yaml").read_bytes() == resolved.read_bytes()


def test_user_spec_pulls_builtin_groups_and_takes_overrides(lmspec, tmp_path: Path) -> None:
    spec = tmp_path / "my_job.yaml"
    spec.write_text(
        "defaults:\n  - model: llama3_8b\n  - parallel: default\n  - train: default\n"
        "  - serve: default\n  - cluster: slurm\n  - convert: default\n  - hardware: h100_80g\n"
        "  - _self_\n\nname: my_job\nhardware:\n  nodes: 2\nparallel:\n  tp: 2\n"
        "  sequence_parallel: true\n  distributed_optimizer: true\n"
    )
    result = lmspec("compile", "--spec", str(spec), "-o", str(tmp_path / "build"), "train.micro_batch_size=2")
    assert result.code == 0, result.err
    plan = json.loads((tmp_path / "build" / "my_job" / "plan.json").read_text())
    assert plan["layout"]["world_size"] == 16 and plan["layout"]["dp"] == 8
    assert plan["batch"]["micro_batch_size"] == 2 and plan["batch"]["grad_accum_steps"] == 1024 // 16


def test_builtin_preset_by_name(lmspec, tmp_path: Path) -> None:
    result = lmspec("compile", "--spec", "config", "-o", str(tmp_path))
    assert result.code == 0 and (tmp_path / "tiny" / "spec.resolved.yaml").is_file()


def _entries(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*"))


def test_a_compile_writes_nothing_outside_the_build_it_was_asked_for(tmp_path: Path) -> None:
    """No cache in the temp dir or the working directory: the builds under -o, and only those.
    The one write elsewhere is matplotlib's own font cache under HOME, kept for every program
    that draws, when a first build draws the memory chart."""
    tmp, cwd, home, out = (tmp_path / name for name in ("tmp", "cwd", "home", "out"))
    for folder in (tmp, cwd, home):
        folder.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("XDG_CACHE_HOME", "XDG_CONFIG_HOME", "MPLCONFIGDIR")}
    env |= {"TMPDIR": str(tmp), "HOME": str(home)}
    lmspec = [sys.executable, "-c", "from lmspec.compiler.cli.main import main; main()"]
    for argv in (
        ["compile", "-o", str(out)],  # a first build: draws the chart
        ["compile", "-o", str(out), "train.steps=3"],  # a rebuild: keeps it
        ["compile", "--check", "-o", str(out), "train.steps=3"],
        ["compile", "-m", "-o", str(out), "train.steps=1,2"],
    ):
        done = subprocess.run([*lmspec, *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
    assert _entries(tmp) == [] and _entries(cwd) == []
    builds = ["tiny", "tiny-train.steps=1", "tiny-train.steps=2"]
    assert sorted(p.name for p in out.iterdir()) == sorted([*builds, "tiny-sweep.md"])
    for build in (out / name for name in builds):
        manifest = json.loads((build / "manifest.json").read_text())
        assert {p for p in _entries(build) if (build / p).is_file()} == {*manifest["files"], "manifest.json"}
    font_cache = [p for p in _entries(home) if (home / p).is_file()]
    assert len(font_cache) == 1 and font_cache[0].startswith(".cache/matplotlib/fontlist-"), font_cache
