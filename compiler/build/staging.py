"""Staging directories and what a killed writer leaves: how a writer names and marks its staging, and
how it (or the next writer) proves such a leftover lmspec's and removes it.

A writer can be killed at any instant (tests/hostile/test_write_kill.py does so at each step), so
what it leaves must be recognisable and removable by the next one without ever deleting a user's
file; the naming and the proofs live here, together, so the name a writer makes and the pattern
that finds it cannot drift apart. Rules:

- Staging names are short and fixed-length (`.lmspec-` + 12 hex, `.part` for a file), so a target of
  any legal name length can be staged; each is made with O_EXCL. A staging directory holds the
  marker `.lmspec-staging` until it is complete.
- Leftovers: every writer holds an exclusive flock on the parent directory while it writes
  (compiler/build/atomic.py), so leftovers found there by the next writer are a dead process's. It
  removes a leftover only when lmspec made it: a `.lmspec-<12 hex>` directory that still holds the
  staging marker (all of it is the writer's), is empty, or whose manifest names what it holds (a
  complete staging or a retired tree: only named files are deleted), and `.lmspec-<12 hex>.part`
  files that are empty or begin as the file being written does (the sweep index's "# Sweep: ").
  Anything it cannot prove is lmspec's stays.
- Deletion of a retired tree removes only the files its manifest names (fd-relative, never through
  a symlink) and then the emptied directories; anything else stays, with a warning.
"""

from __future__ import annotations

import os
import re
import secrets
import stat
from pathlib import Path

from lmspec.compiler.build.earlier import manifest_files
from lmspec.compiler.build.ownership import OWNERS, dirs_above
from lmspec.compiler.build.safe_read import Unreadable, read_regular

IN_PROGRESS = ".lmspec-staging"  # inside a staging directory until it is complete
LEFTOVER_RE = re.compile(r"\.lmspec-[0-9a-f]{12}(\.part)?")

_OWNED_FILE_PREFIXES: set[bytes] = set()  # how the files write_file_atomic was asked to write begin


def staging_name() -> str:
    """A fresh staging name, `.lmspec-<12 hex>` (LEFTOVER_RE finds it again)."""
    return f".lmspec-{secrets.token_hex(6)}"


def make_staging(parent: Path) -> Path:
    """Create an empty staging directory in `parent`, marked as in progress."""
    while True:
        staging = parent / staging_name()
        try:
            os.mkdir(staging, 0o700)
        except FileExistsError:
            continue
        try:
            os.close(os.open(staging / IN_PROGRESS, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
        except BaseException:
            os.rmdir(staging)
            raise
        return staging


def claim_part_prefix(prefix: bytes) -> None:
    """Record how a file this process writes begins, so its killed `.part` is proved lmspec's."""
    _OWNED_FILE_PREFIXES.add(prefix)


def discard(path: Path) -> list[str]:
    """Delete a staging or retired directory as far as it is lmspec's; returns what stays.

    What proves a directory lmspec's (the staging marker, the manifest) is deleted last, so a
    writer killed halfway through leaves a directory the next writer can still prove and clean. A build's
    carried files (made from its manifest, which cannot list them) are lmspec's by name.
    """
    try:
        partial = stat.S_ISREG(os.lstat(path / IN_PROGRESS).st_mode)
    except OSError:
        partial = False
    if partial:  # a staging directory not finished: everything in it is the writer's that made it
        return _remove_named(path, None, {IN_PROGRESS})
    names: set[str] = set()
    proofs = set()
    for owner in OWNERS:
        try:
            names |= set(manifest_files(path, owner.manifest)) | set(owner.carried)
            proofs.add(owner.manifest)
        except Unreadable:
            pass
    return _remove_named(path, names - proofs, proofs)


def discard_quietly(path: Path) -> None:
    """`discard`, where a failure must not hide the error that is already on its way."""
    try:
        discard(path)
    except OSError:
        pass


def _remove_named(root: Path, names: set[str] | None, last: set[str]) -> list[str]:
    """Unlink the regular files under `root` whose relative paths are in `names` (None: all),
    then the directories that became empty, then the top-level files `last` and `root` itself
    once nothing else stays. fd-relative, so a directory swapped for a symlink meanwhile is
    never followed. Returns what stays (not named, or not removable)."""
    above = None if names is None else dirs_above(names | last)
    stays: list[str] = []

    def clear(dirfd: int, prefix: str) -> None:
        with os.scandir(dirfd) as it:
            entries = sorted(it, key=lambda e: e.name)
        for entry in entries:
            rel = prefix + entry.name
            if rel in last:
                continue
            try:
                is_dir = entry.is_dir(follow_symlinks=False)
                if is_dir and (above is None or rel in above):
                    before = len(stays)
                    fd = os.open(entry.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dirfd)
                    try:
                        clear(fd, rel + "/")
                    finally:
                        os.close(fd)
                    if len(stays) == before:
                        os.rmdir(entry.name, dir_fd=dirfd)
                elif not is_dir and (names is None or (rel in names and entry.is_file(follow_symlinks=False))):
                    os.unlink(entry.name, dir_fd=dirfd)
                else:
                    stays.append(rel + ("/" if is_dir else ""))
            except FileNotFoundError:
                pass
            except OSError:
                stays.append(rel)

    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return []
    try:
        clear(fd, "")
        if not stays:
            for name in sorted(last):
                try:
                    os.unlink(name, dir_fd=fd)
                except FileNotFoundError:
                    pass
    finally:
        os.close(fd)
    if not stays:
        os.rmdir(root)
    return stays


def clean_leftovers(parent: Path) -> None:
    """Remove what killed lmspec writers left in `parent` (its lock is held): see the module doc."""
    try:
        with os.scandir(parent) as it:
            leftovers = [Path(e.path) for e in it if LEFTOVER_RE.fullmatch(e.name)]
    except OSError:
        return
    for path in leftovers:
        try:
            mode = os.lstat(path).st_mode
            if path.name.endswith(".part"):
                if stat.S_ISREG(mode) and _is_own_part(path):
                    os.unlink(path)
            elif stat.S_ISDIR(mode):
                discard(path)
        except OSError:
            pass  # left for a later writer; never a reason to fail this one


def _is_own_part(path: Path) -> bool:
    """A `.lmspec-<hex>.part` file is a killed write_file_atomic's when empty or starting with what
    one writes (the prefixes registered by this process's writers)."""
    try:
        data = read_regular(path)
    except Unreadable:
        return False
    return not data or any(data.startswith(prefix) for prefix in _OWNED_FILE_PREFIXES)
