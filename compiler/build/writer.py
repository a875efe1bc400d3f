"""Write a build directory atomically (the files `compiler/emit/manifest.py` made); or check one for drift.

Every directory and file lmspec writes goes through the two safe-write primitives here
(`replace_directory` for builds and converted models, `write_file_atomic` for single files
such as the sweep index). Their rules:

- Ownership: an existing directory is replaced only when it is lmspec's: a real directory
  (not a symlink) holding a regular-file manifest (manifest.json for a build,
  lmspec-convert.json for a converted model) that parses and whose `files` table names
  everything there, i.e. every entry is a regular file the manifest names or a directory on
  the way to one. Anything else (a user's directory, a file, a symlink to anything, a FIFO,
  a build with a file the manifest does not name) is refused with exit 2 and left alone. A
  file a user dropped into build/x is refused, not kept or deleted: keeping it would carry
  a file into the new build that `compile --check` reports as "not emitted" forever, and
  deleting it is data loss; the message names it so the user moves it away. A hand edit of
  a file the manifest names is drift in lmspec's own file and is overwritten (that is what
  a compile is for; `compile --check` reports it first).
- Atomicity: the new tree is written into a staging directory beside the target, then put
  in place with renameat2(RENAME_EXCHANGE) (Linux >= 3.15, glibc via ctypes), so the path
  names the old or the new tree at every instant; a missing target is installed with
  RENAME_NOREPLACE. Where the system or file system has no renameat2 (EINVAL, ENOSYS):
  fallback, the old tree is renamed aside to a dot-name, then the new one renamed in; in
  the window between those two renames the target is missing and the old tree waits,
  whole, under its dot-name (tests/hostile/test_write_kill.py kills a writer there). A
  failure before the swap removes the staging directory and leaves the target as it was.
- Staging names are short and fixed-length (`.lmspec-` + 12 hex, `.part` for a file), so a
  target of any legal name length can be staged; each is made with O_EXCL. A staging
  directory holds the marker `.lmspec-staging` until it is complete.
- Leftovers: every writer holds an exclusive flock on the parent directory while it writes,
  so leftovers found there by the next writer are a dead process's. It removes a leftover
  only when lmspec made it: a `.lmspec-<12 hex>` directory that still holds the staging
  marker (all of it is the writer's), is empty, or whose manifest names what it holds (a
  complete staging or a retired tree: only named files are deleted), and `.lmspec-<12
  hex>.part` files that are empty or begin as the file being written does (the sweep
  index's "# Sweep: "). Anything it cannot prove is lmspec's stays.
- Deletion of a retired tree removes only the files its manifest names (fd-relative, never
  through a symlink) and then the emptied directories; anything else stays, with a warning.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import json
import os
import re
import secrets
import stat
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from lmspec.compiler.build.earlier import manifest_files
from lmspec.compiler.build.files import CONVERTED_MANIFEST, MANIFEST
from lmspec.compiler.build.safe_read import Unreadable, kind_of, read_regular
from lmspec.compiler.errors import UsageError

EXECUTABLE_SUFFIXES = (".sh",)
NAME_MAX = 255  # bytes in one path component (Linux, macOS)
IN_PROGRESS = ".lmspec-staging"  # inside a staging directory until it is complete
LEFTOVER_RE = re.compile(r"\.lmspec-[0-9a-f]{12}(\.part)?")
_LISTED = 5  # entries named in one refusal


@dataclass(frozen=True)
class Owner:
    """Whose directories a writer may replace: those whose `manifest` names everything in them."""

    manifest: str
    what: str  # "an lmspec build"
    fix: str  # what to do instead; {target} is the path
    sealed: bool = False  # True: replace_directory lists the staging's files into `manifest` itself


BUILD = Owner(MANIFEST, "an lmspec build", "move it away, or compile with another -o or name")
CONVERTED = Owner(
    CONVERTED_MANIFEST,
    "a model lmspec's converter wrote",
    "set convert.output to a new directory, or move {target} away",
    sealed=True,
)
OWNER_MANIFESTS = (BUILD.manifest, CONVERTED.manifest)


def build_target(root: Path, name: str) -> Path:
    """`root/name`, where `name` must be one printable path component (spec validation checks
    `name`; this is the writer's own guard that no name ever becomes a path)."""
    if name in ("", ".", "..") or "/" in name or not name.isprintable() or len(name.encode("utf-8")) > NAME_MAX:
        raise UsageError(f"build name {name!r} is not one directory name; set name to letters, digits, '_', '.', '-'")
    return root / name


def write_build(target: Path, files: dict[str, str]) -> None:
    """Write `files` as the build `target`, replacing an earlier lmspec build whole; see the module doc."""
    with replace_directory(target, BUILD) as staging:
        for rel, text in files.items():
            _write_new_file(staging / rel, text.encode("utf-8"), 0o755 if rel.endswith(EXECUTABLE_SUFFIXES) else 0o644)


def stale_files(target: Path, files: dict[str, str]) -> list[str]:
    """`path (missing|changed|not emitted|<why unreadable>)` for each file that differs from a fresh compile.

    Reads never follow a symlink, block on a FIFO or decode bytes; a target that is not a
    directory is a usage error (exit 2), as `compile` would refuse it.
    """
    mode = _lstat_mode(target, "")
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
            found = _walk(target, _dirs_above(files))
        except Unreadable as exc:
            return differences + [f"{target} ({exc.reason})"]
        differences += sorted(f"{_shown_entry(rel, m, False)} (not emitted)" for rel, m in found if rel not in files)
    return differences


def require_replaceable(target: Path, owner: Owner, label: str = "") -> bool:
    """False when nothing is at `target`, True when it is a directory `owner` may replace; otherwise
    a UsageError naming why not. `label` prefixes the path in messages ("convert.output=")."""
    mode = _lstat_mode(target, label)
    if mode is None:
        return False
    reason = _not_owned(target, mode, owner.manifest)
    if reason is not None:
        fix = owner.fix.format(target=target)
        raise UsageError(f"{label}{target} exists and is not {owner.what} ({reason}); {fix}")
    return True


@contextmanager
def replace_directory(target: Path, owner: Owner, label: str = "") -> Iterator[Path]:
    """Yield an empty staging directory beside `target`; when the block completes, it takes
    target's place (see the module doc). On any failure the staging directory is removed and
    `target` is as it was; an OSError becomes a UsageError naming `target`."""
    _check_component(target, label)
    parent = target.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot write {label}{target}: {parent}: {_why(exc)}") from None
    with _locked(parent, label, target) as exclusive:
        if exclusive:
            _clean_leftovers(parent)
        require_replaceable(target, owner, label)
        try:
            staging = _make_staging(parent)
        except OSError as exc:
            raise UsageError(f"cannot write {label}{target}: {_why(exc)}") from None
        try:
            yield staging
            if owner.sealed:
                _seal(staging, owner.manifest)
            os.unlink(staging / IN_PROGRESS)
            os.chmod(staging, 0o755)
            existed = require_replaceable(target, owner, label)  # again: a long block gave time to change it
            _install(staging, target, existed)
        except OSError as exc:
            _discard_quietly(staging)
            raise UsageError(f"cannot write {label}{target}: {_why(exc)}") from None
        except BaseException:
            _discard_quietly(staging)
            raise


def write_file_atomic(path: Path, text: str, *, owned_prefix: str) -> None:
    """Replace the file `path` by `text` with one rename (a `.lmspec-<hex>.part` sibling first).

    An existing `path` is replaced only when it is a regular file whose text starts with
    `owned_prefix` (what lmspec writes there); anything else is refused and left alone.
    """
    _check_component(path, "")
    _OWNED_FILE_PREFIXES.add(owned_prefix.encode("utf-8"))
    parent = path.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        with _locked(parent, "", path) as exclusive:
            if exclusive:
                _clean_leftovers(parent)
            require_own_file(path, owned_prefix)
            replace_file(
                path,
                text.encode("utf-8"),
                parent / f"{_staging_name()}.part",
                lambda: require_own_file(path, owned_prefix),
            )
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {_why(exc)}") from None


def replace_file(path: Path, data: bytes, temp: Path, check: Callable[[], None] = lambda: None) -> None:
    """Replace the file `path` by `data` so that a reader sees the old bytes or the new, never a part:
    write and fsync the new sibling `temp`, run `check` (may refuse), rename it over `path`, fsync
    the directory so the rename survives a crash. `temp` must not exist; it is gone afterwards."""
    try:
        _write_new_file(temp, data, 0o644)
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


# --- ownership -----------------------------------------------------------------------------


def _lstat_mode(path: Path, label: str) -> int | None:
    try:
        return os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the path
        raise UsageError(f"cannot inspect {label}{path}: {_why(exc)}") from None


def _not_owned(target: Path, mode: int, manifest: str) -> str | None:
    """Why the directory entry `target` (lstat mode `mode`) is not lmspec's, or None when it is."""
    if not stat.S_ISDIR(mode):
        return f"it is {kind_of(mode)}"
    try:
        names = set(manifest_files(target, manifest)) | {manifest}
        found = _walk(target, _dirs_above(names))
    except Unreadable as exc:
        return exc.reason
    foreign = [_shown_entry(rel, m, True) for rel, m in found if not (stat.S_ISREG(m) and rel in names)]
    if foreign:
        more = f" and {len(foreign) - _LISTED} more" if len(foreign) > _LISTED else ""
        return f"it holds {', '.join(foreign[:_LISTED])}{more}, which {manifest} does not name"
    return None


def _shown_entry(rel: str, mode: int, with_kind: bool) -> str:
    """A directory entry in a list of differences: `dir/`, or `name (a FIFO)` when `with_kind` and not a file."""
    if stat.S_ISDIR(mode):
        return rel + "/"
    return f"{rel} ({kind_of(mode)})" if with_kind and not stat.S_ISREG(mode) else rel


def _dirs_above(names: Any) -> set[str]:
    """Every directory on the way to one of the relative paths `names` ("a", "a/b" for "a/b/c")."""
    above: set[str] = set()
    for rel in names:
        parts = rel.split("/")
        above.update("/".join(parts[:i]) for i in range(1, len(parts)))
    return above


def _walk(root: Path, descend: set[str]) -> list[tuple[str, int]]:
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
            raise Unreadable(f"cannot list {prefix or './'}: {_why(exc)}") from None

    visit(root, "")
    return found


def require_own_file(path: Path, owned_prefix: str) -> None:
    mode = _lstat_mode(path, "")
    if mode is None:
        return
    try:
        head = read_regular(path)[: len(owned_prefix.encode("utf-8"))]
    except Unreadable as exc:
        raise UsageError(f"{path} exists and lmspec did not write it ({exc.reason}); move it away") from None
    if head != owned_prefix.encode("utf-8"):
        raise UsageError(
            f"{path} exists and lmspec did not write it (it does not start with {owned_prefix!r}); move it away"
        )


def _check_component(target: Path, label: str) -> None:
    """`target` must end in a name that can be one directory entry (not '.', '..', empty, or too long)."""
    name = target.name
    if name in ("", ".", "..") or "\0" in str(target):
        raise UsageError(f"{label}{target} does not name a directory lmspec can write; name a new directory")
    if len(os.fsencode(name)) > NAME_MAX:
        raise UsageError(f"{label}{target}: the name is longer than {NAME_MAX} bytes; choose a shorter one")


# --- staging, swapping, removing -----------------------------------------------------------


_HELD: set[tuple[int, int]] = set()  # parent directories this process holds the lock of
_OWNED_FILE_PREFIXES: set[bytes] = set()  # how the files write_file_atomic was asked to write begin


@contextmanager
def _locked(parent: Path, label: str, target: Path) -> Iterator[bool]:
    """Hold an exclusive flock on the directory `parent` (re-entrant in this process); yields
    False where the file system offers no lock (then leftovers are not cleaned)."""
    try:
        fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno != errno.EACCES:  # a directory one may write but not list can still be written
            raise UsageError(f"cannot write {label}{target}: {parent}: {_why(exc)}") from None
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


def _staging_name() -> str:
    return f".lmspec-{secrets.token_hex(6)}"


def _make_staging(parent: Path) -> Path:
    while True:
        staging = parent / _staging_name()
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


def _write_new_file(path: Path, data: bytes, mode: int) -> None:
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


def _seal(staging: Path, manifest: str) -> None:
    """Write `manifest` into `staging`: every file there and its size, lmspec's claim on the directory."""
    listing = {
        path.relative_to(staging).as_posix(): path.stat().st_size
        for path in sorted(staging.rglob("*"))
        if path.is_file() and path.name != IN_PROGRESS
    }
    doc = {"files": listing, "written_by": "lmspec (compiler/build/writer.py replace_directory)"}
    _write_new_file(staging / manifest, (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode("utf-8"), 0o644)


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
        retired = staging.with_name(_staging_name())
        os.rename(target, retired)
        try:
            os.rename(staging, target)
        except BaseException:
            os.rename(retired, target)
            raise
    try:
        stays = _discard(retired)
    except OSError as exc:
        stays = [f"({_why(exc)})"]
    if stays:
        print(
            f"lmspec: warning: left the previous {target.name} at {retired}: it holds {', '.join(stays[:_LISTED])}, "
            "which lmspec did not write; move what you need out of it and delete it",
            file=sys.stderr,
        )


def _discard(path: Path) -> list[str]:
    """Delete a staging or retired directory as far as it is lmspec's; returns what stays.

    What proves a directory lmspec's (the staging marker, the manifest) is deleted last, so a
    writer killed halfway through leaves a directory the next writer can still prove and clean.
    """
    try:
        partial = stat.S_ISREG(os.lstat(path / IN_PROGRESS).st_mode)
    except OSError:
        partial = False
    if partial:  # a staging directory not finished: everything in it is the writer's that made it
        return _remove_named(path, None, {IN_PROGRESS})
    names: set[str] = set()
    proofs = set()
    for manifest in OWNER_MANIFESTS:
        try:
            names |= set(manifest_files(path, manifest))
            proofs.add(manifest)
        except Unreadable:
            pass
    return _remove_named(path, names - proofs, proofs)


def _discard_quietly(path: Path) -> None:
    try:
        _discard(path)
    except OSError:
        pass


def _unlink_quietly(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _remove_named(root: Path, names: set[str] | None, last: set[str]) -> list[str]:
    """Unlink the regular files under `root` whose relative paths are in `names` (None: all),
    then the directories that became empty, then the top-level files `last` and `root` itself
    once nothing else stays. fd-relative, so a directory swapped for a symlink meanwhile is
    never followed. Returns what stays (not named, or not removable)."""
    above = None if names is None else _dirs_above(names | last)
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


def _clean_leftovers(parent: Path) -> None:
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
                _discard(path)
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


def _why(exc: BaseException) -> str:
    return (exc.strerror if isinstance(exc, OSError) else None) or str(exc)
