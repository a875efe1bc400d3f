"""Write a build directory (the files `compiler/emit/manifest.py` made), or check one for drift.

The build's own job on top of the file-system library: a build is one directory replaced whole
through compiler/build/atomic.py's `replace_directory`, owned by its manifest.json
(compiler/build/ownership.py's BUILD), its scripts executable; `compile --check` compares it with a
fresh compile, listing the directory as the ownership test does.
"""

from __future__ import annotations

import stat
from pathlib import Path

from lmspec.compiler.build.atomic import NAME_MAX, replace_directory, write_new_file
from lmspec.compiler.build.ownership import BUILD, dirs_above, lstat_mode, shown_entry, walk
from lmspec.compiler.build.safe_read import Unreadable, kind_of, read_regular
from lmspec.compiler.errors import UsageError

EXECUTABLE_SUFFIXES = (".sh",)


def build_target(root: Path, name: str) -> Path:
    """`root/name`, where `name` must be one printable path component (spec validation checks
    `name`; this is the writer's own guard that no name ever becomes a path)."""
    if name in ("", ".", "..") or "/" in name or not name.isprintable() or len(name.encode("utf-8")) > NAME_MAX:
        raise UsageError(f"build name {name!r} is not one directory name; set name to letters, digits, '_', '.', '-'")
    return root / name


def write_build(target: Path, files: dict[str, str]) -> None:
    """Write `files` as the build `target`, replacing an earlier lmspec build whole (compiler/build/atomic.py)."""
    with replace_directory(target, BUILD) as staging:
        for rel, text in files.items():
            write_new_file(staging / rel, text.encode("utf-8"), 0o755 if rel.endswith(EXECUTABLE_SUFFIXES) else 0o644)


def stale_files(target: Path, files: dict[str, str]) -> list[str]:
    """`path (missing|changed|not emitted|<why unreadable>)` for each file that differs from a fresh compile.

    Reads never follow a symlink, block on a FIFO or decode bytes; a target that is not a
    directory is a usage error (exit 2), as `compile` would refuse it.
    """
    mode = lstat_mode(target, "")
    if mode is not None and not stat.S_ISDIR(mode):
        raise UsageError(f"{target} is {kind_of(mode)}, not a build directory; {BUILD.fix}")
    differences = []
    for rel, text in files.items():
        try:
            data = read_regular(target / rel)
        except Unreadable as exc:
            differences.append(f"{rel} ({exc.reason})")
            continue
        if data != text.encode("utf-8"):
            differences.append(f"{rel} (changed)")
    if mode is not None:
        try:
            found = walk(target, dirs_above(files))
        except Unreadable as exc:
            return differences + [f"{target} ({exc.reason})"]
        differences += sorted(f"{shown_entry(rel, m, False)} (not emitted)" for rel, m in found if rel not in files)
    return differences
