"""The safe-write primitives of compiler/build/atomic.py on their own, and the sweep point names."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from helpers.tree import snapshot

from lmspec.compiler.build.atomic import NAME_MAX, replace_directory, write_file_atomic
from lmspec.compiler.build.ownership import CONVERTED
from lmspec.compiler.build.writer import build_target
from lmspec.compiler.cli.sweep import sweep_point_name
from lmspec.compiler.errors import UsageError


@pytest.mark.parametrize(
    ("name", "suffix", "expected"),
    [
        pytest.param("tiny", "", "tiny", id="no-sweep"),
        pytest.param("tiny", "parallel.tp=2", "tiny-parallel.tp=2", id="plain"),
        pytest.param("tiny", "parallel.tp=2,train.steps=5", "tiny-parallel.tp=2,train.steps=5", id="plain-two-keys"),
        pytest.param("tiny", "+train.extra=1", "tiny-+train.extra=1", id="plain-append"),
        pytest.param("tiny", "train.checkpoint.dir=a/b", "tiny-train.checkpoint.dir=a_b-c26b9c41", id="slash"),
        pytest.param("tiny", "x=../../v", "tiny-x=.._.._v-", id="dotdot"),
        pytest.param("tiny", "x=a\nb", "tiny-x=a_b-", id="newline"),
        pytest.param("tiny", "x=ü", "tiny-x=_-", id="non-ascii"),
        pytest.param("tiny", "x=a b", "tiny-x=a_b-", id="space"),
        pytest.param("tiny", "~x", "tiny-_x-", id="delete-override"),
    ],
)
def test_sweep_point_names_are_one_safe_component(name: str, suffix: str, expected: str) -> None:
    got = sweep_point_name(name, suffix)
    assert got.startswith(expected)
    assert "/" not in got and "\0" not in got and got.isascii() and got.isprintable()
    assert len(got.encode()) <= NAME_MAX
    if got != f"{name}-{suffix}" and suffix:
        assert len(got) - len(expected) in (0, 8)  # the 8 hex digits of the overrides' sha256 close the name


def test_sweep_point_names_fit_for_long_names_and_values() -> None:
    name = "n" * 246
    assert sweep_point_name(name, "x=1") == name + "-x=1"  # fits: kept plain
    cut = sweep_point_name(name, "train.steps=10")  # does not fit: cut, and the hash keeps it apart
    assert len(cut) == NAME_MAX and cut.startswith(name + "-") and cut != sweep_point_name(name, "train.steps=11")
    long_value = sweep_point_name("tiny", "x=" + "v" * 400)
    assert len(long_value) == NAME_MAX and long_value.startswith("tiny-x=vvv")
    assert sweep_point_name("tiny", "x=" + "v" * 400) != sweep_point_name("tiny", "x=" + "v" * 401)


def test_converter_output_is_sealed_replaced_and_never_foreign(tmp_path: Path) -> None:
    target = tmp_path / "runs" / "hf"
    for weights in (b"first", b"second"):
        with replace_directory(target, CONVERTED, "convert.output=") as staging:
            (staging / "model.safetensors").write_bytes(weights)
            (staging / "config.json").write_text("{}\n")
        assert (target / "model.safetensors").read_bytes() == weights
    seal = json.loads((target / "lmspec-convert.json").read_text())
    assert seal["files"] == {"config.json": 3, "model.safetensors": 6}
    assert sorted(os.listdir(tmp_path / "runs")) == ["hf"]
    (target / "notes.txt").write_text("mine\n")
    before = snapshot(tmp_path)
    with pytest.raises(UsageError, match="convert.output=.*it holds notes.txt, which lmspec-convert.json"):
        with replace_directory(target, CONVERTED, "convert.output="):
            pytest.fail("the block must not run")
    assert snapshot(tmp_path) == before


def test_a_file_dropped_in_while_writing_is_refused_at_the_end(tmp_path: Path) -> None:
    """The ownership test runs again just before the swap: a long conversion gives time to change the target."""
    target = tmp_path / "hf"
    with replace_directory(target, CONVERTED) as staging:
        (staging / "config.json").write_text("{}\n")
    with pytest.raises(UsageError, match="it holds late.txt"):
        with replace_directory(target, CONVERTED) as staging:
            (staging / "config.json").write_text('{"new": 1}\n')
            (target / "late.txt").write_text("written by the user meanwhile\n")
    assert sorted(os.listdir(tmp_path)) == ["hf"]
    assert (target / "config.json").read_text() == "{}\n" and (target / "late.txt").is_file()


def test_a_failing_block_leaves_the_target_and_no_staging(tmp_path: Path) -> None:
    target = tmp_path / "hf"
    with replace_directory(target, CONVERTED) as staging:
        (staging / "config.json").write_text("{}\n")
    before = snapshot(tmp_path)
    with pytest.raises(RuntimeError, match="mapping mismatch"):
        with replace_directory(target, CONVERTED) as staging:
            (staging / "half.safetensors").write_bytes(b"\0" * 10)
            raise RuntimeError("mapping mismatch")
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("path", [".", "..", "a/..", "/", "x\0y"], ids=["dot", "dotdot", "a-dotdot", "root", "nul"])
def test_paths_not_naming_one_new_directory_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a").mkdir()
    before = snapshot(tmp_path)
    with pytest.raises(UsageError, match="does not name a directory lmspec can write"):
        with replace_directory(Path(path), CONVERTED, "convert.output="):
            pytest.fail("the block must not run")
    assert snapshot(tmp_path) == before


def test_write_file_atomic_replaces_only_its_own_file(tmp_path: Path) -> None:
    index = tmp_path / "tiny-sweep.md"
    write_file_atomic(index, "# Sweep: a\n", owned_prefix="# Sweep: ")
    write_file_atomic(index, "# Sweep: b\n", owned_prefix="# Sweep: ")
    assert index.read_text() == "# Sweep: b\n" and sorted(os.listdir(tmp_path)) == ["tiny-sweep.md"]
    index.write_text("my notes\n")
    with pytest.raises(UsageError, match="lmspec did not write it"):
        write_file_atomic(index, "# Sweep: c\n", owned_prefix="# Sweep: ")
    assert index.read_text() == "my notes\n" and sorted(os.listdir(tmp_path)) == ["tiny-sweep.md"]


@pytest.mark.parametrize("name", ["tiny\n", "a/b", "..", ".", "", "x\ty", "n" * 256], ids=repr)
def test_a_build_name_never_becomes_a_path(tmp_path: Path, name: str) -> None:
    with pytest.raises(UsageError, match="is not one directory name"):
        build_target(tmp_path, name)


def test_a_legal_build_name_is_one_entry_of_the_root(tmp_path: Path) -> None:
    assert build_target(tmp_path, "n" * 246) == tmp_path / ("n" * 246)
