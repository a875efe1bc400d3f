"""What a compile reads from the machine is read in one step (compiler/inputs.py) and nowhere else:
the rules and the emitters never touch the file system (an AST scan that is shown not to be blind),
two machines holding the same inputs compile byte-identical builds, and `compile --check` answers
from that step."""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

import pytest
from helpers.tokenizers import train_bpe_tokenizer

from lmspec.compiler import pipeline
from lmspec.compiler.cli.main import run
from lmspec.compiler.data.sidecar import DatasetSidecar, sidecar_path
from lmspec.compiler.data.tokenizer_files import read_tokenizer_files
from lmspec.compiler.inputs import CompileInputs, read_inputs
from lmspec.compiler.paths import ROOT
from lmspec.compiler.spec.sections import Spec

PURE = ("compiler/emit", "compiler/rules")
MACHINE_MODULES = {"os", "shutil", "glob", "tempfile", "subprocess"}  # io is in-memory buffers; io.open is a call
MACHINE_NAMES = {
    "open",
    "Path",
    "getcwd",
    "realpath",
    # lmspec's own readers of the machine: a module that imports one reads through it
    "read_sidecar",
    "read_tokenizer_files",
    "read_regular",
    "read_regular_below",
    "manifest_files",
    "EarlierBuild",
    "read_inputs",
}
MACHINE_METHODS = {
    "open",
    "read_text",
    "read_bytes",
    "write_text",
    "write_bytes",
    "exists",
    "is_file",
    "is_dir",
    "is_symlink",
    "iterdir",
    "glob",
    "rglob",
    "stat",
    "lstat",
    "resolve",
    "readlink",
    "samefile",
    "mkdir",
    "cwd",
    "getcwd",
    "realpath",
    "listdir",
    "scandir",
    "walk",
    "FileSystemLoader",
}
# Reads of lmspec's own install, not of the machine's inputs: the same bytes wherever lmspec runs.
ALLOWED = {("compiler/emit/render.py", "FileSystemLoader")}  # the shipped templates/ (compiler/paths.py)


def machine_reads(source: str) -> list[tuple[int, str]]:
    """(line, what) for each import of a file-system module or reader, and each call of one."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] in MACHINE_MODULES]
        elif isinstance(node, ast.ImportFrom):
            module = (node.module or "").split(".")[0]
            found += [(node.lineno, a.name) for a in node.names if module in MACHINE_MODULES or a.name in MACHINE_NAMES]
        elif isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name) and func.id in MACHINE_NAMES:
                found.append((node.lineno, func.id))
            elif isinstance(func, ast.Attribute) and func.attr in MACHINE_METHODS:
                found.append((node.lineno, func.attr))
    return found


def pure_modules() -> list[Path]:
    return sorted(p for folder in PURE for p in (ROOT / folder).rglob("*.py"))


def test_rules_and_emitters_never_read_the_machine() -> None:
    reads = [
        f"{path.relative_to(ROOT)}:{line}: {what}"
        for path in pure_modules()
        for line, what in machine_reads(path.read_text())
        if (path.relative_to(ROOT).as_posix(), what) not in ALLOWED
    ]
    assert reads == [], "read it in compiler/inputs.py and pass it in (CompileInputs):\n" + "\n".join(reads)


def test_the_scan_is_not_blind() -> None:
    sample = """
import os
import shutil as sh
from pathlib import Path
from os.path import realpath
from lmspec.compiler.data.sidecar import read_sidecar
from lmspec.compiler.build.earlier import EarlierBuild
from pathlib import PurePosixPath
open("x")
io.open("x")
Path("x").read_text()
p.read_bytes()
p.exists()
p.is_file()
os.getcwd()
os.path.realpath("x")
read_tokenizer_files(d)
EarlierBuild(root).file("x")
jinja2.FileSystemLoader("t")
PurePosixPath("x").name
"""
    found = {what for _, what in machine_reads(sample)}
    assert found >= {"os", "shutil", "Path", "realpath", "read_sidecar", "EarlierBuild", "open", "read_text"}
    assert found >= {"read_bytes", "exists", "is_file", "getcwd", "read_tokenizer_files", "FileSystemLoader"}
    assert "PurePosixPath" not in found and "name" not in found
    # the step that does read the machine is seen doing it; the former readers are among the scanned
    inputs = {what for _, what in machine_reads((ROOT / "compiler" / "inputs.py").read_text())}
    assert {"os", "Path", "getcwd", "read_sidecar", "read_tokenizer_files", "EarlierBuild"} <= inputs
    scanned = {p.relative_to(ROOT).as_posix() for p in pure_modules()}
    assert {
        "compiler/emit/report_data.py",
        "compiler/emit/manifest.py",
        "compiler/emit/conversion.py",
        "compiler/rules/data.py",
        "compiler/rules/run_paths.py",
    } <= scanned
    assert len(scanned) > 30


OVERRIDES = [
    "train.data.tokenizer=hf",
    "train.data.tokenizer_path=tok",
    "train.data.sources=[{path:data/a,weight:3},{path:./data/../data/a,weight:1}]",
]


def _machine(root: Path) -> str:
    """A machine's working directory holding the inputs: a tokenizer and one dataset's sidecar. Returns
    the tokenizer's sha256."""
    tokenizer = read_tokenizer_files(train_bpe_tokenizer(root / "tok"))
    (root / "data").mkdir(parents=True)
    sidecar_path(root / "data" / "a").write_text(DatasetSidecar(tokenizer.sha256, 384, 0, 7, 30_720).text())
    return tokenizer.sha256


def _files(build: Path) -> dict[str, bytes]:
    return {p.relative_to(build).as_posix(): p.read_bytes() for p in sorted(build.rglob("*")) if p.is_file()}


def test_two_machines_with_the_same_inputs_compile_the_same_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    builds = []
    for machine in ("one", "two"):
        sha = _machine(tmp_path / machine)
        monkeypatch.chdir(tmp_path / machine)
        assert run(["compile", "-o", "build", *OVERRIDES]) == 0
        builds.append(_files(tmp_path / machine / "build" / "tiny"))
    assert builds[0] == builds[1]
    report = builds[0]["REPORT.md"].decode()
    # the inputs that change the build are recorded in it: the tokenizer, the sidecar, the two spellings
    assert f"tokenizer.json sha256 {sha[:12]}, 384 ids" in report and "| 7 | 30,720 |" in report
    assert "is the same dataset as train.data.sources.0.path" in report


def test_compile_check_answers_from_the_inputs_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _machine(tmp_path / "one")
    monkeypatch.chdir(tmp_path / "one")
    assert run(["compile", "-o", "build", *OVERRIDES]) == 0
    read: list[CompileInputs] = []

    def recording(spec: Spec, earlier: Path | None = None) -> CompileInputs:
        read.append(read_inputs(spec, earlier))
        return read[-1]

    monkeypatch.setattr(pipeline, "read_inputs", recording)
    assert run(["compile", "--check", "-o", "build", *OVERRIDES]) == 0
    assert len(read) == 1  # one step, before the rules and the Plan
    recorded = read[0]
    # another machine: the same tree without the dataset's sidecar is stale ...
    shutil.copytree(tmp_path / "one", tmp_path / "two", symlinks=True)
    sidecar_path(tmp_path / "two" / "data" / "a").unlink()
    monkeypatch.chdir(tmp_path / "two")
    monkeypatch.setattr(pipeline, "read_inputs", read_inputs)
    assert run(["compile", "--check", "-o", "build", *OVERRIDES]) == 1
    # ... and up to date when that step hands it the first machine's inputs: nothing else was read there
    monkeypatch.setattr(pipeline, "read_inputs", lambda spec, earlier=None: recorded)
    assert run(["compile", "--check", "-o", "build", *OVERRIDES]) == 0
