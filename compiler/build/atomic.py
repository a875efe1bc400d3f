"""Replace a directory or a file so that its path names the old or the new version at every instant.

The project's file-system library: every directory and file lmspec writes goes through
`replace_directory` (builds, converted models), `write_file_atomic` (single files such as the sweep
index) or `replace_file` (a checkpoint's tracker file). They are kept apart from the build writer
(compiler/build/writer.py) because the converter and the runtime use them with no build in sight.
What may be replaced is compiler/build/ownership.py's test; how staging is named and how a killed
writer's leftovers are proved and removed is compiler/build/staging.py's. Atomicity:

- The new tree is written into a staging directory beside the target, then put in place with
  renameat2(RENAME_EXCHANGE) (Linux >= 3.15, glibc via ctypes), so the path names the old or the
  new tree at every instant; a missing target is installed with RENAME_NOREPLACE. Where the system
  or file system has no renameat2 (EINVAL, ENOSYS): fallback, the old tree is renamed aside to a
  dot-name, then the new one renamed in; in the window between those two renames the target is
  missing and the old tree waits, whole, under its dot-name (tests/hostile/test_write_kill.py kills
  a writer there). A failure before the swap removes the staging directory and leaves the target
  as it was.
- Every writer holds an exclusive flock on the parent directory while it writes, so leftovers
  found there by the next writer are a dead process's.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any

from lmspec.compiler.build.ownership import LISTED, Owner, require_own_file, require_replaceable, why
from lmspec.compiler.build.staging import (
    IN_PROGRESS,
    claim_part_prefix,
    clean_leftovers,
    discard,
    discard_quietly,
    make_staging,
    staging_name,
)
from lmspec.compiler.errors import UsageError

NAME_MAX = 255  # bytes in one path component (Linux, macOS)


@contextmanager
def replace_directory(target: Path, owner: Owner, label: str = "") -> Iterator[Path]:
    """Yield an empty staging directory beside `target`; when the block completes, it takes
    target's place (see the module doc). On any failure the staging directory is removed, and so are
    the missing parents made for it; `target` is as it was; an OSError becomes a UsageError naming `target`."""
    _check_component(target, label)
    parent = target.parent
    created = missing_directories(parent)
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        remove_empty(created)
        raise UsageError(f"cannot write {label}{target}: {parent}: {why(exc)}") from None
    try:
        with _locked(parent, label, target) as exclusive:
            if exclusive:
                clean_leftovers(parent)
            require_replaceable(target, owner, label)
            try:
                staging = make_staging(parent)
            except OSError as exc:
                raise UsageError(f"cannot write {label}{target}: {why(exc)}") from None
            try:
                yield staging
                if owner.sealed:
                    _seal(staging, owner.manifest)
                os.unlink(staging / IN_PROGRESS)
                os.chmod(staging, 0o755)
                existed = require_replaceable(target, owner, label)  # again: a long block gave time to change it
                _install(staging, target, existed)
            except OSError as exc:
                discard_quietly(staging)
                raise UsageError(f"cannot write {label}{target}: {why(exc)}") from None
            except BaseException:
                discard_quietly(staging)
                raise
    except BaseException:
        remove_empty(created)  # a failed write leaves no directory it made on the way (`-o out/build` on a full disk)
        raise


def write_file_atomic(path: Path, text: str | bytes, *, owned_prefix: str | bytes) -> None:
    """Replace the file `path` by `text` (UTF-8 when a str) with one rename (a `.lmspec-<hex>.part` sibling
    first): a full disk or a kill leaves the old file or none, never a part of the new one.

    An existing `path` is replaced only when it is a regular file whose text starts with
    `owned_prefix` (what lmspec writes there); anything else is refused and left alone.
    """
    _check_component(path, "")
    data = text.encode("utf-8") if isinstance(text, str) else text
    claim_part_prefix(owned_prefix.encode("utf-8") if isinstance(owned_prefix, str) else owned_prefix)
    parent = path.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        with _locked(parent, "", path) as exclusive:
            if exclusive:
                clean_leftovers(parent)
            require_own_file(path, owned_prefix)
            replace_file(
                path,
                data,
                parent / f"{staging_name()}.part",
                lambda: require_own_file(path, owned_prefix),
            )
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {why(exc)}") from None


def replace_file(path: Path, data: bytes, temp: Path, check: Callable[[], None] = lambda: None) -> None:
    """Replace the file `path` by `data` so that a reader sees the old bytes or the new, never a part:
    write and fsync the new sibling `temp`, run `check` (may refuse), rename it over `path`, fsync
    the directory so the rename survives a crash. `temp` must not exist; it is gone afterwards."""
    try:
        write_new_file(temp, data, 0o644)
        check()
        os.replace(temp, path)
    except BaseException:
        _unlink_quietly(temp)
        raise
    fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_new_file(path: Path, data: bytes, mode: int) -> None:
    """Create `path` (never an existing one, never through a symlink), write, fsync; `mode` exactly."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fchmod(fd, mode)
        os.fsync(fd)
    finally:
        os.close(fd)


def _check_component(target: Path, label: str) -> None:
    """`target` must end in a name that can be one directory entry (not '.', '..', empty, or too long)."""
    name = target.name
    if name in ("", ".", "..") or "\0" in str(target):
        raise UsageError(f"{label}{target} does not name a directory lmspec can write; name a new directory")
    if len(os.fsencode(name)) > NAME_MAX:
        raise UsageError(f"{label}{target}: the name is longer than {NAME_MAX} bytes; choose a shorter one")


_HELD: set[tuple[int, int]] = set()  # parent directories this process holds the lock of


@contextmanager
def _locked(parent: Path, label: str, target: Path) -> Iterator[bool]:
    """Hold an exclusive flock on the directory `parent` (re-entrant in this process); yields
    False where the file system offers no lock (then leftovers are not cleaned)."""
    try:
        fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno != errno.EACCES:  # a directory one may write but not list can still be written
            raise UsageError(f"cannot write {label}{target}: {parent}: {why(exc)}") from None
        yield False
        return
    try:
        info = os.fstat(fd)
        key = (info.st_dev, info.st_ino)
        if key in _HELD:
            locked = True
            held_here = False
        else:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                locked = held_here = True
            except OSError:
                locked = held_here = False
        if held_here:
            _HELD.add(key)
        try:
            yield locked
        finally:
            if held_here:
                _HELD.discard(key)
    finally:
        os.close(fd)


def _seal(staging: Path, manifest: str) -> None:
    """Write `manifest` into `staging`: every file there and its size, lmspec's claim on the directory."""
    listing = {
        path.relative_to(staging).as_posix(): path.stat().st_size
        for path in sorted(staging.rglob("*"))
        if path.is_file() and path.name != IN_PROGRESS
    }
    doc = {"files": listing, "written_by": "lmspec (compiler/build/atomic.py replace_directory)"}
    write_new_file(staging / manifest, (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode("utf-8"), 0o644)


_AT_FDCWD = -100
RENAME_NOREPLACE, RENAME_EXCHANGE = 1, 2


@cache
def _renameat2_function() -> Any:
    try:
        function = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):  # not glibc >= 2.28, or not Linux
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    function.restype = ctypes.c_int
    return function


def _renameat2(source: Path, destination: Path, flags: int) -> bool:
    """renameat2(source, destination, flags): True when done, False when this system or file
    system does not offer it (then the caller falls back); OSError for any other failure."""
    function = _renameat2_function()
    if function is None:
        return False
    if function(_AT_FDCWD, os.fsencode(source), _AT_FDCWD, os.fsencode(destination), flags) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), str(source), None, str(destination))


def _install(staging: Path, target: Path, existed: bool) -> None:
    """Put the complete `staging` at `target` (an lmspec tree when `existed`), then remove the old tree."""
    if not existed:
        if not _renameat2(staging, target, RENAME_NOREPLACE):
            if os.path.lexists(target):
                raise FileExistsError(errno.EEXIST, "something appeared there while lmspec was writing", str(target))
            os.rename(staging, target)
        return
    if _renameat2(staging, target, RENAME_EXCHANGE):
        retired = staging  # the old tree is at the staging name now
    else:  # fallback: target is missing between these two renames; the old tree waits whole at `retired`
        retired = staging.with_name(staging_name())
        os.rename(target, retired)
        try:
            os.rename(staging, target)
        except BaseException:
            os.rename(retired, target)
            raise
    try:
        stays = discard(retired)
    except OSError as exc:
        stays = [f"({why(exc)})"]
    if stays:
        print(
            f"lmspec: warning: left the previous {target.name} at {retired}: it holds {', '.join(stays[:LISTED])}, "
            "which lmspec did not write; move what you need out of it and delete it",
            file=sys.stderr,
        )


def missing_directories(directory: Path) -> list[Path]:
    """`directory` and its parents that do not exist yet, innermost first: what making it will create, for
    `remove_empty` to take back when the write they were made for fails."""
    return [d for d in (directory, *directory.parents) if not os.path.lexists(d)]


def remove_empty(directories: list[Path]) -> None:
    """rmdir each of `directories`, innermost first; one that holds something now (another writer's) stays."""
    for directory in directories:
        try:
            os.rmdir(directory)
        except OSError:
            pass


def _unlink_quietly(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
