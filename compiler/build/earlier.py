"""The build already on disk, as a source of files a compile may keep instead of redrawing.

A file is offered only while its bytes still hash to what that build's manifest recorded,
so a hand-edited artifact is never carried into a new build.

Every read of a directory lmspec may not have written (the earlier build, `compile --check`,
the ownership test of compiler/build/writer.py) goes through `read_regular`: it never follows a
final symlink, never blocks on a FIFO (opened O_NONBLOCK, then refused by fstat), reads
regular files only and at most READ_LIMIT_BYTES, and reports every failure as `Unreadable`
with a short reason instead of an exception a user would see as a traceback.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path

from lmspec.compiler.build.digest import sha256
from lmspec.compiler.build.files import MANIFEST

READ_LIMIT_BYTES = 64 << 20  # a build's largest file (a chart, REPORT.md) is well under 1 MiB


class Unreadable(Exception):
    """A file that is not there as a readable regular file; `reason` says why, for a message."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def kind_of(mode: int) -> str:
    """What a non-regular file is, in words: 'a directory', 'a symlink', 'a FIFO', ..."""
    for test, words in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISLNK, "a symlink"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISREG, "a regular file"),
    ):
        if test(mode):
            return words
    return "a special file"


def read_regular(path: Path, limit: int = READ_LIMIT_BYTES) -> bytes:
    """The bytes of the regular file `path`; raises Unreadable ('missing', 'a FIFO, not a regular file', ...)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            raise Unreadable("missing") from None
        if exc.errno == errno.ELOOP:
            raise Unreadable("a symlink, not a regular file") from None
        if exc.errno == errno.ENXIO:
            raise Unreadable("a socket, not a regular file") from None
        raise Unreadable(f"unreadable: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise Unreadable(f"{kind_of(info.st_mode)}, not a regular file")
        if info.st_size > limit:
            raise Unreadable(f"{info.st_size} bytes, more than a build file can be ({limit})")
        chunks, size = [], 0
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                raise Unreadable(f"more than {limit} bytes")
        return b"".join(chunks)
    except OSError as exc:
        raise Unreadable(f"unreadable: {exc.strerror}") from None
    finally:
        os.close(fd)


def manifest_files(root: Path, manifest: str = MANIFEST) -> dict[str, object]:
    """The `files` table of `root/manifest` (relative path -> what it recorded: a sha256, a size);
    raises Unreadable."""
    try:
        doc = json.loads(read_regular(root / manifest).decode("utf-8"))
    except Unreadable as exc:
        raise Unreadable(f"no {manifest}" if exc.reason == "missing" else f"{manifest} is {exc.reason}") from None
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise Unreadable(f"{manifest} is not valid JSON") from None
    recorded = doc.get("files") if isinstance(doc, dict) else None
    if not isinstance(recorded, dict) or not all(isinstance(k, str) for k in recorded):
        raise Unreadable(f"{manifest} has no table of the files lmspec wrote")
    return recorded


class EarlierBuild:
    """Read-only view of `root` (which may not exist): files still as its manifest recorded them."""

    def __init__(self, root: Path) -> None:
        self.root = root
        try:
            recorded = manifest_files(root)
        except Unreadable:
            recorded = {}
        self._recorded: dict[str, str] = {k: v for k, v in recorded.items() if isinstance(v, str)}

    def file(self, rel: str) -> str | None:
        """The text of `rel`, or None when absent, unreadable or changed since it was written."""
        expected = self._recorded.get(rel)
        if expected is None:
            return None
        try:
            data = read_regular(self.root / rel)
        except Unreadable:
            return None
        if sha256(data) != expected:
            return None
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            return None
