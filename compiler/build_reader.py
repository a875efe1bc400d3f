"""Read a compiled build back: the runtime uses only files that hash to what manifest.json recorded.

`open_build(dir)` reads manifest.json (a regular file of at most MAX_MANIFEST_BYTES, strict
JSON of the shape compiler/writer.py writes, by this lmspec version). From the open `Build`:

- `build.read(rel)` / `text` / `json`: a file's bytes, handed out only when their sha256 is
  the manifest's; each file is read once and what was hashed is what gets parsed;
- `build.spec`: spec.resolved.yaml through the schema into the typed Spec; `build.plan`,
  `build.mapping`: plan.json and convert/mapping.json as checked JSON documents;
- `build.script(rel)`: verifies a file another program reads from disk (bash runs
  launch/torchrun.sh, vLLM reads serve/vllm.yaml) and returns its path.

Anything else is a `DamagedBuild` (a UsageError: exit 2) naming the file and the command that
compiles the build again. Files are opened below the build directory one component at a time
without following symlinks, and only after lstat says "regular file", with O_NONBLOCK and an
fstat check after opening: a FIFO or device where a build file belongs is refused, never
opened or waited on. The writer writes regular files only, so nothing it writes is refused.

What this cannot catch: a manifest rewritten by hand to match edited files (it is a record,
not a signature) and a script edited between its check and bash reading it.
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import re
import shlex
import stat
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import yaml

from compiler import __version__
from compiler.errors import UsageError
from compiler.paths import SPECS_DIR, display_path
from compiler.sections import Spec

MANIFEST = "manifest.json"
SPEC_FILE = "spec.resolved.yaml"
PLAN_FILE = "plan.json"
MAPPING_FILE = "convert/mapping.json"
MAX_MANIFEST_BYTES = 1 << 20  # a manifest lists a dozen files: ~2 KB
MAX_FILE_BYTES = 64 << 20  # the largest artifact, DeepSeek-V3's mapping, is well under 1 MB
_SHA256 = re.compile(r"[0-9a-f]{64}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
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


def _printable(text: str) -> str:
    """`text` with control characters escaped: a message stays one line."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def _shown(path: Path, rel: str | None = None) -> str:
    """`path` (and `rel` below it, as given: a file there may be a symlink loop) as a user reads it."""
    try:
        shown = display_path(path)
    except (OSError, RuntimeError):  # Python 3.11's resolve() raises on a symlink loop
        shown = str(path)
    return _printable(f"{shown}/{rel}" if rel else shown)


def recompile_command(root: Path, manifest: Manifest | None) -> str:
    """The command that compiles `root` again, from what its manifest records."""
    parent = _shown(root.parent)
    if manifest is None:
        return (
            f"move {_shown(root)} aside and compile again (lmspec compile -o {parent} "
            "with the spec and overrides it came from)"
        )
    preset = (SPECS_DIR / f"{manifest.name}.yaml").is_file()
    argv = ["lmspec", "compile", *(["--spec", manifest.name] if preset else []), "-o", parent, *manifest.overrides]
    command = _printable(shlex.join(argv))
    notes = [] if preset else ["with --spec SPEC if it was compiled from one"]
    if root.name != manifest.name:
        notes.append(f"it writes {parent}/{manifest.name}")
    return f"recompile it: `{command}`" + (f" ({'; '.join(notes)})" if notes else "")


def _describe(mode: int) -> str:
    if stat.S_ISREG(mode):
        return "a regular file"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISLNK(mode):
        return "a symbolic link (a build holds only regular files)"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return f"of file type {stat.S_IFMT(mode):o}"


class _Unreadable(Exception):
    """Why a build file could not be read (turned into a DamagedBuild by the caller)."""


def _os_reason(exc: OSError) -> str:
    if exc.errno == errno.ENOENT:
        return "is missing"
    if exc.errno == errno.ELOOP:
        return "is a symbolic link (a build holds only regular files)"
    if exc.errno == errno.ENOTDIR:
        return "is not a directory"
    return f"cannot be read ({exc.strerror or exc})"


def _open_dir(root: Path) -> int:
    try:
        return os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise _Unreadable(f"its directory {_os_reason(exc)}") from None


def _read_below(root: Path, rel: str, limit: int) -> bytes:
    """The bytes of regular file `root/rel`, opened without following symlinks or blocking."""
    *dirs, name = rel.split("/")
    fd = _open_dir(root)
    try:
        for part in dirs:
            try:
                info = os.stat(part, dir_fd=fd, follow_symlinks=False)
                if not stat.S_ISDIR(info.st_mode):
                    raise _Unreadable(f"{part}/ is {_describe(info.st_mode)}, not a directory")
                inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except OSError as exc:
                raise _Unreadable(f"{part}/ {_os_reason(exc)}") from None
            os.close(fd)
            fd = inner
        try:
            info = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if not stat.S_ISREG(info.st_mode):
                raise _Unreadable(f"is {_describe(info.st_mode)}, not a regular file")
            file_fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd)
        except OSError as exc:
            raise _Unreadable(_os_reason(exc)) from None
    finally:
        os.close(fd)
    try:
        info = os.fstat(file_fd)
        if not stat.S_ISREG(info.st_mode):  # swapped between lstat and open
            raise _Unreadable(f"is {_describe(info.st_mode)}, not a regular file")
        if info.st_size > limit:
            raise _Unreadable(f"is {info.st_size} bytes, more than any build file ({limit} bytes)")
        chunks, total = [], 0
        while chunk := os.read(file_fd, 1 << 20):
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:
                raise _Unreadable(f"is more than {limit} bytes, more than any build file")
        return b"".join(chunks)
    except OSError as exc:
        raise _Unreadable(_os_reason(exc)) from None
    finally:
        os.close(file_fd)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"key {key!r} appears twice")
        out[key] = value
    return out


def _strict_json(data: bytes) -> Any:
    """Standard JSON only (no NaN/Infinity, no repeated keys); ValueError otherwise."""
    text = data.decode("utf-8")  # UnicodeDecodeError is a ValueError
    try:
        return json.loads(text, parse_constant=_refuse_constant, object_pairs_hook=_no_duplicates)
    except RecursionError:
        raise ValueError("nested too deep") from None


def _manifest_from(doc: Any) -> Manifest:
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
    if not isinstance(name, str) or not name or _CONTROL.search(name):
        raise ValueError("'name' is not a build name")
    if not isinstance(overrides, list) or not all(isinstance(o, str) for o in overrides):
        raise ValueError("'overrides' is not a list of strings")
    if not isinstance(choices, dict) or not all(isinstance(v, str) for v in choices.values()):
        raise ValueError("'choices' is not a mapping of group names to options")
    if not isinstance(files, dict):
        raise ValueError("'files' is not a mapping of paths to sha256s")
    for rel, digest in files.items():
        parts = rel.split("/")
        if not rel or rel.startswith("/") or any(p in ("", ".", "..") for p in parts) or _CONTROL.search(rel):
            raise ValueError(f"'files' names {_printable(rel)!r}, not a path inside the build")
        if not isinstance(digest, str) or not _SHA256.fullmatch(digest):
            raise ValueError(f"'files' gives {_printable(rel)} no sha256")
    for required in (SPEC_FILE, PLAN_FILE):
        if required not in files:
            raise ValueError(f"'files' does not list {required}")
    if spec_sha != files[SPEC_FILE]:
        raise ValueError(f"'spec_sha256' is not the sha256 'files' gives {SPEC_FILE}")
    return Manifest(version, name, tuple(overrides), dict(choices), spec_sha, dict(files))


def _plain_problem(value: Any, where: str = "") -> str | None:
    """Where the YAML holds something a JSON spec cannot (bytes, dates, NaN, non-string keys)."""
    todo: list[tuple[Any, str]] = [(value, where)]
    while todo:
        node, at = todo.pop()
        if isinstance(node, dict):
            for key, child in node.items():
                if not isinstance(key, str):
                    return f"{at or 'the top level'} has a key {key!r} that is not a string"
                todo.append((child, f"{at}.{key}" if at else key))
        elif isinstance(node, list):
            todo.extend((child, f"{at}[{i}]") for i, child in enumerate(node))
        elif isinstance(node, float) and not math.isfinite(node):
            return f"{at}={node} is not a finite number"
        elif node is not None and not isinstance(node, (str, int, float, bool)):
            return f"{at} holds a YAML {type(node).__name__}, not a spec value"
    return None


def _yaml_document(text: str) -> Any:
    """One YAML document with no anchors or aliases (lmspec writes none; an alias bomb expands)."""
    for event in yaml.parse(text, Loader=_SAFE_LOADER):
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
            mark = event.start_mark
            raise ValueError(f"line {mark.line + 1}: YAML anchors and aliases are not written by lmspec")
    return yaml.load(text, Loader=_SAFE_LOADER)


class Build:
    """A compiled build directory whose files are handed out only as the manifest recorded them."""

    def __init__(self, root: Path, manifest: Manifest) -> None:
        self.root = root
        self.manifest = manifest
        self._bytes: dict[str, bytes] = {}

    @classmethod
    def open(cls, root: Path) -> Build:
        shown = _shown(root, MANIFEST)
        if not root.is_dir():
            what = "no such directory" if not os.path.lexists(root) else "not a directory"
            raise DamagedBuild(
                MANIFEST,
                f"{_shown(root)} is not a build directory ({what}); compile one with `lmspec compile` "
                "and pass build/<name>",
            )
        try:
            data = _read_below(root, MANIFEST, MAX_MANIFEST_BYTES)
        except _Unreadable as exc:
            if str(exc) == "is missing":
                raise DamagedBuild(
                    MANIFEST,
                    f"{_shown(root)} is not a build directory (no {MANIFEST}); compile one with "
                    "`lmspec compile` and pass build/<name>",
                ) from None
            raise DamagedBuild(MANIFEST, f"{shown}: {exc}; {recompile_command(root, None)}") from None
        try:
            manifest = _manifest_from(_strict_json(data))
        except ValueError as exc:
            raise DamagedBuild(
                MANIFEST,
                f"{shown}: not a manifest lmspec wrote ({_printable(str(exc))}); {recompile_command(root, None)}",
            ) from None
        if manifest.lmspec_version != __version__:
            raise DamagedBuild(
                MANIFEST,
                f"{_shown(root)} was compiled by lmspec {_printable(manifest.lmspec_version)} ({MANIFEST}), this is "
                f"lmspec {__version__}, whose runtime may read it differently; {recompile_command(root, manifest)}",
            )
        return cls(root, manifest)

    def refuse(self, rel: str, problem: str, fix: str | None = None) -> DamagedBuild:
        return DamagedBuild(rel, f"{_shown(self.root, rel)}: {_printable(problem)}; {fix or self.recompile()}")

    def recompile(self) -> str:
        return recompile_command(self.root, self.manifest)

    def has(self, rel: str) -> bool:
        """Whether the manifest lists `rel` (files that only some builds have, e.g. ds_config.json)."""
        return rel in self.manifest.files

    def read(self, rel: str) -> bytes:
        """The bytes of `rel`, read once, only if they hash to what the manifest recorded."""
        if rel in self._bytes:
            return self._bytes[rel]
        expected = self.manifest.files.get(rel)
        if expected is None:
            raise self.refuse(rel, f"not listed in {MANIFEST}, so not part of what lmspec compiled")
        try:
            data = _read_below(self.root, rel, MAX_FILE_BYTES)
        except _Unreadable as exc:
            raise self.refuse(rel, str(exc)) from None
        if hashlib.sha256(data).hexdigest() != expected:
            fix = None
            if rel == SPEC_FILE:  # an edited resolved spec can be compiled as it stands
                fix = (
                    f"lmspec runs only what it compiled: compile your edits with `lmspec compile --spec "
                    f"{shlex.quote(_shown(self.root, rel))} -o {shlex.quote(_shown(self.root.parent))}`, "
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
            return _strict_json(self.read(rel))
        except ValueError as exc:
            raise self.refuse(rel, f"not a JSON document lmspec wrote ({_printable(str(exc))})") from None

    def script(self, rel: str) -> Path:
        """The path of `rel` for a program that reads it from disk, after checking its bytes."""
        self.read(rel)
        return self.root / rel

    @cached_property
    def spec(self) -> Spec:
        """spec.resolved.yaml through the schema (compiler/schema_check.py) into the typed Spec."""
        from compiler.provenance import Origins
        from compiler.schema_check import schema_problems
        from compiler.typed import from_dict

        text = self.text(SPEC_FILE)
        try:
            data = _yaml_document(text)
        except (yaml.YAMLError, ValueError, RecursionError) as exc:
            raise self.refuse(SPEC_FILE, f"not a YAML spec ({_printable(str(exc)).splitlines()[0]})") from None
        if not isinstance(data, dict):
            raise self.refuse(SPEC_FILE, f"a YAML {type(data).__name__} where the spec's mapping belongs")
        problem = _plain_problem(data)
        if problem:
            raise self.refuse(SPEC_FILE, _printable(problem))
        origins = Origins({key: _shown(self.root, SPEC_FILE) for key in data})
        problems = [p for p in schema_problems(data, origins) if p.severity == "error"]
        if problems:
            listed = "; ".join(_printable(p.message) for p in problems[:_LISTED])
            more = f" (+{len(problems) - _LISTED} more)" if len(problems) > _LISTED else ""
            raise self.refuse(SPEC_FILE, f"does not match lmspec {__version__}'s schema: {listed}{more}")
        try:
            spec = from_dict(Spec, data)
        except (TypeError, ValueError, KeyError) as exc:
            raise self.refuse(SPEC_FILE, f"not a spec this lmspec reads ({_printable(str(exc))})") from None
        if spec.name != self.manifest.name:
            raise self.refuse(SPEC_FILE, f"names the job {spec.name!r}, {MANIFEST} names it {self.manifest.name!r}")
        return spec

    def _document(self, rel: str, sections: dict[str, type]) -> dict[str, Any]:
        doc = self.json(rel)
        if not isinstance(doc, dict):
            raise self.refuse(rel, f"a JSON {type(doc).__name__} where a mapping belongs")
        for key, kind in sections.items():
            value = doc.get(key)
            if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
                raise self.refuse(rel, f"its {key!r} entry is missing or not a {kind.__name__}")
        return doc

    @cached_property
    def plan(self) -> dict[str, Any]:
        """plan.json: what lmspec derived (layout, batch, ...), written by this build's lmspec."""
        doc = self._document(PLAN_FILE, {"lmspec_version": str, "layout": dict, "batch": dict})
        if doc["lmspec_version"] != self.manifest.lmspec_version:
            raise self.refuse(PLAN_FILE, f"written by lmspec {doc['lmspec_version']!r}, {MANIFEST} by {__version__}")
        return doc

    @cached_property
    def mapping(self) -> dict[str, Any]:
        """convert/mapping.json: the reviewed conversion table the convert and verify stages execute."""
        return self._document(
            MAPPING_FILE,
            {
                "backend": str,
                "checkpoint_dir": str,
                "output": str,
                "tensors": list,
                "hf_tensor_count": int,
                "hf_config": dict,
            },
        )


def open_build(root: Path) -> Build:
    """The build at `root`, its manifest checked; a DamagedBuild (exit 2) if it is not one lmspec wrote."""
    return Build.open(root)
