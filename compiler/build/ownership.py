"""Which directories and files lmspec may replace: the ownership test every safe write runs first.

A compile or a conversion overwrites a path a user named, so before anything is replaced it must be
proved lmspec's; this module is that proof, kept apart from the writing (compiler/build/atomic.py)
so the drift check (compiler/build/writer.py `stale_files`) lists a directory the same way. Rules:

- A directory is replaced only when it is lmspec's: a real directory (not a symlink) holding a
  regular-file manifest (manifest.json for a build, lmspec-convert.json for a converted model,
  lmspec-quantize.json for a quantized one) that
  parses and whose `files` table names everything there, i.e. every entry is a regular file the
  manifest names or a directory on the way to one; a build may also hold the files its launcher carries
  (compiler/build/files.py CARRIED: made from the manifest, so it cannot list them), admitted by name.
  Anything else (a user's directory, a file, a symlink to anything, a FIFO, a build with a file the
  manifest does not name) is refused with exit 2 and left alone. A file a user dropped into build/x is
  refused, not kept or deleted: keeping it
  would carry a file into the new build that `compile --check` reports as "not emitted" forever, and
  deleting it is data loss; the message names it so the user moves it away. A hand edit of a file
  the manifest names is drift in lmspec's own file and is overwritten (that is what a compile is
  for; `compile --check` reports it first).
- A single file (the sweep index, an imported model's spec) is replaced only when it is a regular
  file whose text begins as lmspec writes it there.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from lmspec.compiler.build.earlier import manifest_files
from lmspec.compiler.build.files import CARRIED, CONVERTED_MANIFEST, MANIFEST, QUANTIZED_MANIFEST
from lmspec.compiler.build.safe_read import Unreadable, kind_of, read_regular
from lmspec.compiler.errors import UsageError

LISTED = 5  # entries named in one refusal


@dataclass(frozen=True)
class Owner:
    """Whose directories a writer may replace: those whose `manifest` names everything in them."""

    manifest: str
    what: str  # "an lmspec build"
    fix: str  # what to do instead; {target} is the path
    sealed: bool = False  # True: replace_directory lists the staging's files into `manifest` itself
    carried: tuple[str, ...] = ()  # files it may hold that `manifest` does not name (made from the manifest)


BUILD = Owner(MANIFEST, "an lmspec build", "move it away, or compile with another -o or name", carried=CARRIED)
CONVERTED = Owner(
    CONVERTED_MANIFEST,
    "a model lmspec's converter wrote",
    "set convert.output to a new directory, or move {target} away",
    sealed=True,
)
QUANTIZED = Owner(
    QUANTIZED_MANIFEST,
    "a model lmspec's quantize stage wrote",
    "set quantize.output to a new directory, or move {target} away",
    sealed=True,
)
OWNERS = (BUILD, CONVERTED, QUANTIZED)


def require_replaceable(target: Path, owner: Owner, label: str = "") -> bool:
    """False when nothing is at `target`, True when it is a directory `owner` may replace; otherwise
    a UsageError naming why not. `label` prefixes the path in messages ("convert.output=")."""
    mode = lstat_mode(target, label)
    if mode is None:
        return False
    reason = _not_owned(target, mode, owner)
    if reason is not None:
        fix = owner.fix.format(target=target)
        raise UsageError(f"{label}{target} exists and is not {owner.what} ({reason}); {fix}")
    return True


def require_own_file(path: Path, owned_prefix: str | bytes) -> None:
    """Nothing at `path`, or a regular file starting with `owned_prefix`; otherwise a UsageError."""
    mode = lstat_mode(path, "")
    if mode is None:
        return
    prefix = owned_prefix.encode("utf-8") if isinstance(owned_prefix, str) else owned_prefix
    try:
        head = read_regular(path)[: len(prefix)]
    except Unreadable as exc:
        raise UsageError(f"{path} exists and lmspec did not write it ({exc.reason}); move it away") from None
    if head != prefix:
        raise UsageError(
            f"{path} exists and lmspec did not write it (it does not start with {owned_prefix!r}); move it away"
        )


def lstat_mode(path: Path, label: str) -> int | None:
    """The lstat mode of `path`, None when nothing is there; a UsageError when it cannot be inspected."""
    try:
        return os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the path
        raise UsageError(f"cannot inspect {label}{path}: {why(exc)}") from None


def _not_owned(target: Path, mode: int, owner: Owner) -> str | None:
    """Why the directory entry `target` (lstat mode `mode`) is not `owner`'s, or None when it is."""
    manifest = owner.manifest
    if not stat.S_ISDIR(mode):
        return f"it is {kind_of(mode)}"
    try:
        names = set(manifest_files(target, manifest)) | {manifest, *owner.carried}
        found = walk(target, dirs_above(names))
    except Unreadable as exc:
        return exc.reason
    foreign = [shown_entry(rel, m, True) for rel, m in found if not (stat.S_ISREG(m) and rel in names)]
    if foreign:
        more = f" and {len(foreign) - LISTED} more" if len(foreign) > LISTED else ""
        return f"it holds {', '.join(foreign[:LISTED])}{more}, which {manifest} does not name"
    return None


def shown_entry(rel: str, mode: int, with_kind: bool) -> str:
    """A directory entry in a list of differences: `dir/`, or `name (a FIFO)` when `with_kind` and not a file."""
    if stat.S_ISDIR(mode):
        return rel + "/"
    return f"{rel} ({kind_of(mode)})" if with_kind and not stat.S_ISREG(mode) else rel


def dirs_above(names: Iterable[str]) -> set[str]:
    """Every directory on the way to one of the relative paths `names` ("a", "a/b" for "a/b/c")."""
    above: set[str] = set()
    for rel in names:
        parts = rel.split("/")
        above.update("/".join(parts[:i]) for i in range(1, len(parts)))
    return above


def walk(root: Path, descend: set[str]) -> list[tuple[str, int]]:
    """(relative path, lstat mode) of every entry under `root` except the directories in
    `descend`, which are walked into instead (never through a symlink); raises Unreadable."""
    found: list[tuple[str, int]] = []

    def visit(directory: Path, prefix: str) -> None:
        try:
            with os.scandir(directory) as it:
                entries = sorted(it, key=lambda e: e.name)
            for entry in entries:
                rel = prefix + entry.name
                mode = entry.stat(follow_symlinks=False).st_mode
                if stat.S_ISDIR(mode) and rel in descend:
                    visit(directory / entry.name, rel + "/")
                else:
                    found.append((rel, mode))
        except OSError as exc:
            raise Unreadable(f"cannot list {prefix or './'}: {why(exc)}") from None

    visit(root, "")
    return found


DISK_FIXES = {
    errno.ENOSPC: "free space on that file system, or write elsewhere",
    errno.EDQUOT: "free space within your quota there, or write elsewhere",
    errno.EROFS: "remount it writable, or write elsewhere",
}


def why(exc: BaseException) -> str:
    """An exception's words for a message: an OSError's strerror (and the fix, for a full or read-only file
    system), else its text."""
    if not isinstance(exc, OSError) or not exc.strerror:
        return str(exc)
    fix = DISK_FIXES.get(exc.errno or 0)
    return f"{exc.strerror} ({fix})" if fix else exc.strerror
