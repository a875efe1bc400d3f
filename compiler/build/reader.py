"""Read a compiled build back: the runtime uses only files that hash to what manifest.json recorded.

`Build.open(dir)` reads manifest.json (a regular file of at most MAX_MANIFEST_BYTES, strict
JSON of the shape compiler/build/writer.py writes, by this lmspec version). From the open `Build`:

- `build.read(rel)` / `text` / `json`: a file's bytes, handed out only when their sha256 is
  the manifest's; each file is read once and what was hashed is what gets parsed;
- `build.spec`: spec.resolved.yaml through the schema into the typed Spec; `build.plan`: the
  typed Plan that plan.json serialises (compiler/plan.py, Plan.from_json); `build.mapping`:
  convert/mapping.json as a checked JSON document;
- the Plan: every rank opens the build, so `Build.open(dir)` compares plan.json with the Plan of
  the spec without running the cost model (memory, communication), whose sections need only be
  there (the Plan derives them from the spec if a reader asks, never from the file);
  `Build.open(dir, cost_model=True)`, what the commands that run once use (`lmspec run` before it
  starts anything, `diff`, `logs`, `doctor`), compares those too, so an edited plan.json is refused whole;
- `build.script(rel)`: verifies a file another program reads from disk (bash runs
  launch/torchrun.sh, vLLM reads serve/vllm.yaml) and returns its path.

A carried file (compiler/build/files.py CARRIED: the build ConfigMap, made from the manifest) is not
listed, so `read` refuses it like any file lmspec did not compile: a reader makes it again from the
listed files with the launcher's `carries` and compares.

Anything else is a `DamagedBuild` (a UsageError: exit 2) naming the file and the command that
compiles the build again. Files are read with compiler/build/safe_read.py: regular files only, no
symlinks followed below the build directory, bounded in size; a FIFO or device where a build
file belongs is refused, never opened or waited on. The writer writes regular files only.

What this cannot catch: a manifest rewritten by hand to match edited files (it is a record,
not a signature) and a script edited between its check and bash reading it.
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import yaml

from lmspec.compiler import __version__
from lmspec.compiler.build.digest import sha256
from lmspec.compiler.build.files import MANIFEST, MAPPING, PLAN, SPEC
from lmspec.compiler.build.safe_read import (
    CONTROL,
    Unreadable,
    plain_problem,
    printable,
    read_regular_below,
    strict_json,
    yaml_document,
)
from lmspec.compiler.errors import UsageError
from lmspec.compiler.paths import SPECS_DIR, display_path
from lmspec.compiler.plan import Plan
from lmspec.compiler.spec.load import Composed
from lmspec.compiler.spec.provenance import Origins
from lmspec.compiler.spec.sections import ServingSpec, Spec, TrainingSpec, serving, training

MAX_MANIFEST_BYTES = 1 << 20  # a manifest lists a dozen files: ~2 KB
MAX_FILE_BYTES = 64 << 20  # the largest artifact, DeepSeek-V3's mapping, is well under 1 MB
_SHA256 = re.compile(r"[0-9a-f]{64}")
_LISTED = 3  # schema problems quoted in one refusal


class DamagedBuild(UsageError):
    """A build file is missing, unreadable, not what lmspec wrote, or not of this version (exit 2)."""

    def __init__(self, file: str, message: str) -> None:
        super().__init__(message)
        self.file = file


@dataclass(frozen=True)
class Manifest:
    """manifest.json: how the build was made and the sha256 of every file in it."""

    lmspec_version: str
    name: str
    overrides: tuple[str, ...]
    choices: dict[str, str]
    spec_sha256: str
    files: dict[str, str]
    text: str  # the file itself, as `lmspec diff` lists it


def _shown_path(path: Path, rel: str | None = None) -> str:
    """`path` (and `rel` below it, as given: a file there may be a symlink loop) as a user reads it."""
    try:
        shown = display_path(path)
    except (OSError, RuntimeError):  # Python 3.11's resolve() raises on a symlink loop
        shown = str(path)
    return printable(f"{shown}/{rel}" if rel else shown)


def recompile_command(root: Path, manifest: Manifest | None) -> str:
    """The command that compiles `root` again, from what its manifest records."""
    parent = _shown_path(root.parent)
    if manifest is None:
        return (
            f"move {_shown_path(root)} aside and compile again (lmspec compile -o {parent} "
            "with the spec and overrides it came from)"
        )
    preset = (SPECS_DIR / f"{manifest.name}.yaml").is_file()
    argv = ["lmspec", "compile", *(["--spec", manifest.name] if preset else []), "-o", parent, *manifest.overrides]
    command = printable(shlex.join(argv))
    notes = [] if preset else ["with --spec SPEC if it was compiled from one"]
    if root.name != manifest.name:
        notes.append(f"it writes {parent}/{manifest.name}")
    return f"recompile it: `{command}`" + (f" ({'; '.join(notes)})" if notes else "")


def _manifest_from(doc: Any, text: str) -> Manifest:
    """The manifest's fields, each of the type the writer writes; ValueError names the first that is not."""
    if not isinstance(doc, dict):
        raise ValueError(f"a JSON {type(doc).__name__ if doc is not None else 'null'} where a mapping belongs")
    for key in ("lmspec_version", "name", "overrides", "choices", "spec_sha256", "files"):
        if key not in doc:
            raise ValueError(f"no {key!r} entry")
    version, name, spec_sha = doc["lmspec_version"], doc["name"], doc["spec_sha256"]
    overrides, choices, files = doc["overrides"], doc["choices"], doc["files"]
    if not isinstance(version, str) or not version:
        raise ValueError("'lmspec_version' is not a version string")
    if not isinstance(name, str) or not name or CONTROL.search(name):
        raise ValueError("'name' is not a build name")
    if not isinstance(overrides, list) or not all(isinstance(o, str) for o in overrides):
        raise ValueError("'overrides' is not a list of strings")
    if not isinstance(choices, dict) or not all(isinstance(v, str) for v in choices.values()):
        raise ValueError("'choices' is not a mapping of group names to options")
    if not isinstance(files, dict):
        raise ValueError("'files' is not a mapping of paths to sha256s")
    for rel, digest in files.items():
        parts = rel.split("/")
        if not rel or rel.startswith("/") or any(p in ("", ".", "..") for p in parts) or CONTROL.search(rel):
            raise ValueError(f"'files' names {printable(rel)!r}, not a path inside the build")
        if not isinstance(digest, str) or not _SHA256.fullmatch(digest):
            raise ValueError(f"'files' gives {printable(rel)} no sha256")
    for required in (SPEC, PLAN):
        if required not in files:
            raise ValueError(f"'files' does not list {required}")
    if spec_sha != files[SPEC]:
        raise ValueError(f"'spec_sha256' is not the sha256 'files' gives {SPEC}")
    return Manifest(version, name, tuple(overrides), dict(choices), spec_sha, dict(files), text)


def read_manifest(root: Path) -> Manifest:
    """The manifest of the build at `root`, of any lmspec version; DamagedBuild if there is none
    or it is not one lmspec wrote (what tells an lmspec build from any other directory)."""
    shown = _shown_path(root, MANIFEST)
    if not root.is_dir():
        what = "no such directory" if not os.path.lexists(root) else "not a directory"
        raise DamagedBuild(
            MANIFEST,
            f"{_shown_path(root)} is not a build directory ({what}); compile one with `lmspec compile` "
            "and pass build/<name>",
        )
    try:
        data = read_regular_below(root, MANIFEST, MAX_MANIFEST_BYTES)
    except Unreadable as exc:
        if exc.missing:
            raise DamagedBuild(
                MANIFEST,
                f"{_shown_path(root)} is not a build directory (no {MANIFEST}); compile one with "
                "`lmspec compile` and pass build/<name>",
            ) from None
        raise DamagedBuild(MANIFEST, f"{shown}: {exc}; {recompile_command(root, None)}") from None
    try:
        return _manifest_from(strict_json(data), data.decode("utf-8"))
    except ValueError as exc:
        raise DamagedBuild(
            MANIFEST, f"{shown}: not a manifest lmspec wrote ({printable(str(exc))}); {recompile_command(root, None)}"
        ) from None


class Build:
    """A compiled build directory whose files are handed out only as the manifest recorded them,
    with its typed Spec and Plan; made by `Build.open`."""

    spec: Spec  # spec.resolved.yaml through the schema
    plan: Plan  # plan.json, round-tripped into the Plan

    def __init__(self, root: Path, manifest: Manifest) -> None:
        self.root = root
        self.manifest = manifest
        self._bytes: dict[str, bytes] = {}

    @classmethod
    def open(cls, root: Path, *, cost_model: bool = False) -> Build:
        """The build at `root`: manifest checked, spec and plan read and verified before any stage
        reads anything else; a DamagedBuild (exit 2) if it is not what lmspec wrote. plan.json's
        cost-model sections are compared with the spec's only with `cost_model`: a command that runs once
        asks for it, a rank does not."""
        manifest = read_manifest(root)
        if manifest.lmspec_version != __version__:
            raise DamagedBuild(
                MANIFEST,
                f"{_shown_path(root)} was compiled by lmspec {printable(manifest.lmspec_version)} ({MANIFEST}), "
                f"this is lmspec {__version__}, whose runtime may read it differently; "
                f"{recompile_command(root, manifest)}",
            )
        build = cls(root, manifest)
        spec, data, origins = build._read_spec()
        build.spec = spec
        build.plan = build._read_plan(spec, data, origins, cost_model)
        return build

    def training(self) -> TrainingSpec:
        """The spec of a build that trains; UsageError for a serve-only build (train: null)."""
        trains = training(self.spec)
        if trains is None:
            raise UsageError(
                f"{_shown_path(self.root)} is a serve-only job (train: null): it has no training, checkpoint or "
                f"conversion; run `lmspec run {shlex.quote(_shown_path(self.root))} --stage serve`"
            )
        return trains

    def serving(self) -> ServingSpec:
        """The spec of a build that serves; UsageError for a train-only build (serve: null)."""
        serves = serving(self.spec)
        if serves is None:
            raise UsageError(
                f"{_shown_path(self.root)} is a train-only job (serve: null): it has no serving artifacts; "
                "compile it with a serve section (serve=default) to serve"
            )
        return serves

    def refuse(self, rel: str, problem: str, fix: str | None = None) -> DamagedBuild:
        return DamagedBuild(rel, f"{_shown_path(self.root, rel)}: {printable(problem)}; {fix or self.recompile()}")

    def recompile(self) -> str:
        return recompile_command(self.root, self.manifest)

    def read(self, rel: str) -> bytes:
        """The bytes of `rel`, read once, only if they hash to what the manifest recorded."""
        if rel in self._bytes:
            return self._bytes[rel]
        expected = self.manifest.files.get(rel)
        if expected is None:
            raise self.refuse(rel, f"not listed in {MANIFEST}, so not part of what lmspec compiled")
        try:
            data = read_regular_below(self.root, rel, MAX_FILE_BYTES)
        except Unreadable as exc:
            raise self.refuse(rel, str(exc)) from None
        if sha256(data) != expected:
            fix = None
            if rel == SPEC:  # an edited resolved spec can be compiled as it stands
                fix = (
                    f"lmspec runs only what it compiled: compile your edits with `lmspec compile --spec "
                    f"{shlex.quote(_shown_path(self.root, rel))} -o {shlex.quote(_shown_path(self.root.parent))}`, "
                    f"or undo them: {self.recompile()}"
                )
            raise self.refuse(
                rel, f"changed since lmspec compiled it (its sha256 is not the one {MANIFEST} records)", fix
            )
        self._bytes[rel] = data
        return data

    def text(self, rel: str) -> str:
        try:
            return self.read(rel).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self.refuse(rel, f"not UTF-8 text (byte {exc.start})") from None

    def json(self, rel: str) -> Any:
        try:
            return strict_json(self.read(rel))
        except ValueError as exc:
            raise self.refuse(rel, f"not a JSON document lmspec wrote ({printable(str(exc))})") from None

    def script(self, rel: str) -> Path:
        """The path of `rel` for a program that reads it from disk, after checking its bytes."""
        self.read(rel)
        return self.root / rel

    def _read_spec(self) -> tuple[Spec, dict[str, Any], Origins]:
        """spec.resolved.yaml through the schema (compiler/spec/schema_check.py) into the typed Spec,
        with the plain document and its origins (every key from the build's spec file)."""
        from lmspec.compiler.spec.schema_check import schema_problems
        from lmspec.compiler.spec.typed import from_dict

        text = self.text(SPEC)
        try:
            data = yaml_document(text)
        except (yaml.YAMLError, ValueError, RecursionError) as exc:
            raise self.refuse(SPEC, f"not a YAML spec ({printable(str(exc)).splitlines()[0]})") from None
        if not isinstance(data, dict):
            raise self.refuse(SPEC, f"a YAML {type(data).__name__} where the spec's mapping belongs")
        problem = plain_problem(data)
        if problem:
            raise self.refuse(SPEC, printable(problem))
        origins = Origins({key: _shown_path(self.root, SPEC) for key in data})
        problems = [p for p in schema_problems(data, origins) if p.severity == "error"]
        if problems:
            listed = "; ".join(printable(p.message) for p in problems[:_LISTED])
            more = f" (+{len(problems) - _LISTED} more)" if len(problems) > _LISTED else ""
            raise self.refuse(SPEC, f"does not match lmspec {__version__}'s schema: {listed}{more}")
        try:
            spec = from_dict(Spec, data)
        except (TypeError, ValueError, KeyError) as exc:
            raise self.refuse(SPEC, f"not a spec this lmspec reads ({printable(str(exc))})") from None
        if spec.name != self.manifest.name:
            raise self.refuse(SPEC, f"names the job {spec.name!r}, {MANIFEST} names it {self.manifest.name!r}")
        return spec, data, origins

    def _document(self, rel: str, sections: dict[str, type]) -> dict[str, Any]:
        doc = self.json(rel)
        if not isinstance(doc, dict):
            raise self.refuse(rel, f"a JSON {type(doc).__name__} where a mapping belongs")
        for key, kind in sections.items():
            value = doc.get(key)
            if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
                raise self.refuse(rel, f"its {key!r} entry is missing or not a {kind.__name__}")
        return doc

    def _read_plan(self, spec: Spec, data: dict[str, Any], origins: Origins, cost_model: bool) -> Plan:
        """plan.json as the typed Plan (compiler/plan.py): what lmspec derived, written by this build's lmspec.
        The rules are the compiler's, checked when the build was compiled: a build whose files hash to
        its manifest holds a spec they accepted, and the runtime never imports them (compiler/contract.py).
        The Plan has no warnings here; `lmspec logs` asks the rules for them (compiler/observe/logs)."""
        parts = {"layout": dict, "batch": dict} if training(spec) is not None else {}
        doc = self._document(PLAN, {"lmspec_version": str, **parts, **({"serve": dict} if serving(spec) else {})})
        if doc["lmspec_version"] != self.manifest.lmspec_version:
            raise self.refuse(PLAN, f"written by lmspec {doc['lmspec_version']!r}, {MANIFEST} by {__version__}")
        composed = Composed(data, origins, self.manifest.overrides, dict(self.manifest.choices))
        try:
            return Plan.from_json(doc, spec, composed, [], cost_model=cost_model)
        except ValueError as exc:
            raise self.refuse(PLAN, printable(str(exc))) from None

    @cached_property
    def mapping(self) -> dict[str, Any]:
        """convert/mapping.json: the reviewed conversion table the convert and verify stages execute."""
        return self._document(
            MAPPING,
            {
                "backend": str,
                "checkpoint_dir": str,
                "output": str,
                "tensors": list,
                "hf_tensor_count": int,
                "hf_config": dict,
            },
        )
