"""The wheel installs one top-level import name, `lmspec`, holding every package of the tree and its
data (specs, schemas, templates, scaffold, corpus, the step-time calibration): no bare `compiler` or
`runtime` in site-packages, and no package directory forgotten by pyproject's explicit list."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TREES = {"compiler": "lmspec.compiler", "runtime": "lmspec.runtime"}


def _packages_in_tree() -> set[str]:
    found = {"lmspec.schemas", "lmspec.templates", "lmspec.specs"}
    for folder, name in TREES.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            relative = init.parent.relative_to(ROOT / folder)
            found.add(".".join([name, *relative.parts]))
    return found


def test_pyproject_lists_every_package_of_the_tree() -> None:
    listed = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    assert sorted(listed) == sorted(_packages_in_tree())


@pytest.mark.slow
def test_the_wheel_holds_only_the_lmspec_namespace_with_its_data(tmp_path: Path) -> None:
    source = tmp_path / "source"  # setuptools builds in the source tree: a copy keeps the checkout clean
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for folder in (*TREES, "schemas", "templates", "specs"):
        shutil.copytree(ROOT / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path)]
        + [str(source)],
        check=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("lmspec-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names if not name.startswith("lmspec-")}
    assert tops == {"lmspec"}
    packages = {Path(n).parent.as_posix().replace("/", ".") for n in names if n.endswith("/__init__.py")}
    assert packages == _packages_in_tree() - {"lmspec.schemas", "lmspec.templates", "lmspec.specs"}
    for data in (
        "lmspec/specs/config.yaml",
        "lmspec/schemas/spec.schema.json",
        "lmspec/templates/torchrun.sh.j2",
        "lmspec/compiler/cli/scaffold/starter_spec.yaml.j2",
        "lmspec/compiler/models/steptime_calibration.json",
        "lmspec/compiler/models/serve_calibration.json",  # compiler/models/serve_step.py reads it
        "lmspec/runtime/train/corpus/training_notes.txt",
        "lmspec/runtime/train/__main__.py",
    ):
        assert data in names, data
