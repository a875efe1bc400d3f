"""Editors: every shipped spec names its schema in a yaml-language-server modeline, and
check-jsonschema (an upstream tool, not lmspec) accepts every file against it."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
import sys
import typing
from collections import defaultdict
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator

from lmspec.compiler.paths import SCHEMA_FILE, SPECS_DIR
from lmspec.compiler.spec.schema import schema_files, section_names
from lmspec.compiler.spec.sections import Spec

MODELINE = re.compile(r"^# yaml-language-server: \$schema=(\S+)$")
SPEC_FILES = sorted(SPECS_DIR.rglob("*.yaml"))
CHECK_JSONSCHEMA = Path(sys.executable).with_name("check-jsonschema")


def _header(path: Path) -> list[str]:
    lines = path.read_text(encoding="utf-8").splitlines()
    return [line for line in lines[: next(i for i, text in enumerate(lines) if not text.startswith("#"))]]


def _schema_of(path: Path) -> Path:
    for line in _header(path):
        match = MODELINE.match(line)
        if match:
            return (path.parent / match.group(1)).resolve()
    raise AssertionError(f"{path} has no `# yaml-language-server: $schema=...` line in its header")


def test_committed_schema_files_are_generated() -> None:
    files = schema_files()
    assert set(files) == {"spec.schema.json", "spec-file.schema.json", *(f"{s}.schema.json" for s in section_names())}
    for name, text in files.items():
        committed = SCHEMA_FILE.parent / name
        assert committed.is_file() and committed.read_text(encoding="utf-8") == text, (
            f"schemas/{name} is stale: run `python -m lmspec.compiler.spec.schema`"
        )
        Draft202012Validator.check_schema(json.loads(text))


@pytest.mark.parametrize("path", SPEC_FILES, ids=lambda p: str(p.relative_to(SPECS_DIR)))
def test_every_spec_names_an_existing_schema(path: Path) -> None:
    schema = _schema_of(path)
    assert schema.parent == SCHEMA_FILE.parent and schema.is_file()
    header = _header(path)
    if any("@package" in line for line in header):  # Hydra reads `# @package` only as the first line(s)
        assert header[0] == "# @package _global_" and schema.name == "spec-file.schema.json"


def _check_jsonschema(schema: Path, files: list[Path]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(CHECK_JSONSCHEMA), "--schemafile", str(schema), *map(str, files)],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.skipif(not CHECK_JSONSCHEMA.exists(), reason="check-jsonschema is not installed in this environment")
def test_check_jsonschema_accepts_every_shipped_spec() -> None:
    by_schema: dict[Path, list[Path]] = defaultdict(list)
    for path in SPEC_FILES:
        by_schema[_schema_of(path)].append(path)
    assert len(by_schema) == len(section_names()) + 1  # one per group, plus primary files
    for schema, files in by_schema.items():
        result = _check_jsonschema(schema, files)
        assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.skipif(not CHECK_JSONSCHEMA.exists(), reason="check-jsonschema is not installed in this environment")
def test_check_jsonschema_rejects_a_typo_in_a_group_file(tmp_path: Path) -> None:
    bad = tmp_path / "h100_80g.yaml"
    shutil.copy(SPECS_DIR / "hardware" / "h100_80g.yaml", bad)
    bad.write_text(bad.read_text(encoding="utf-8").replace("gpus_per_node:", "gpu_per_node:"), encoding="utf-8")
    result = _check_jsonschema(_schema_of(SPECS_DIR / "hardware" / "h100_80g.yaml"), [bad])
    assert result.returncode == 1 and "gpu_per_node" in result.stdout + result.stderr


def _leaf_keys(node: dict, path: str = ""):
    for name, prop in node.get("properties", {}).items():
        options = [prop, *prop.get("anyOf", [])]
        # a section is an object of keys; a key whose value is a mapping (train.megatron.extra) has examples
        objects = [o for o in options if o.get("type") == "object" and "examples" not in prop]
        if objects:
            for option in objects:
                yield from _leaf_keys(option, f"{path}{name}.")
        else:
            yield f"{path}{name}", prop


def _spec_keys(section: type, path: str = ""):
    """The dotted keys of a typed section: its fields, nested sections walked into (a list of sections, such as
    cluster.kubernetes.tolerations, is one key: the schema describes its items)."""
    hints = typing.get_type_hints(section)
    for field in dataclasses.fields(section):
        hint = hints[field.name]
        walked = () if typing.get_origin(hint) is list else (hint, *typing.get_args(hint))
        nested = [t for t in walked if dataclasses.is_dataclass(t)]
        if nested:
            yield from _spec_keys(nested[0], f"{path}{field.name}.")
        else:
            yield f"{path}{field.name}"


def test_every_key_has_a_description_and_an_example_for_editors() -> None:
    schema = json.loads((SCHEMA_FILE).read_text(encoding="utf-8"))
    keys = dict(_leaf_keys(schema))
    assert sorted(keys) == sorted(_spec_keys(Spec))  # every key of the typed sections, and no other
    missing = sorted(k for k, prop in keys.items() if not prop.get("description") or not prop.get("examples"))
    assert missing == [], f"keys without a description or an example in compiler/spec/sections/: {missing}"
