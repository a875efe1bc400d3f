"""Reading files that may be hostile: regular files only, bounded, parsed strictly.

Two readers, one failure type (`Unreadable`, whose text reads after "<path>: " and which says
whether the file was simply missing):
- `read_regular_below(root, rel, limit)`, for a build or data directory a reader is handed: it
  opens `root/rel` one path component at a time without following symlinks, and only after lstat
  says "regular file" (then with O_NONBLOCK, checked again by fstat); its reasons are verb
  phrases (`is a FIFO, not a regular file`).
- `read_regular(path, limit)`, for a directory a compile may overwrite (the earlier build,
  `compile --check`, the writer's ownership test): it refuses a symlink at the final component
  only, opens with O_NONBLOCK and checks fstat; its reasons are noun phrases (`a FIFO, not a
  regular file`), as the writer's messages put them after "is" themselves.
Either way a FIFO or device where a file belongs is refused, never waited on, and a file over
`limit` bytes is refused by its size before it is read. `strict_json` accepts standard JSON only
(no NaN/Infinity, no repeated keys, no stack overflow); `yaml_document` refuses anchors and
aliases (an alias bomb expands in whatever walks the result); `plain_problem` finds what a
JSON-shaped spec cannot hold (bytes, dates, NaN, odd keys).
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import stat
from pathlib import Path
from typing import Any

import yaml

CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def printable(text: str) -> str:
    """`text` with control characters escaped: a message stays one line."""
    return CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def _describe(mode: int) -> str:
    if stat.S_ISREG(mode):
        return "a regular file"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISLNK(mode):
        return "a symbolic link (links are not followed)"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return f"of file type {stat.S_IFMT(mode):o}"


READ_LIMIT_BYTES = 64 << 20  # read_regular's default: a build's largest file (a chart, REPORT.md) is well under 1 MiB


class Unreadable(Exception):
    """Why a file could not be read, as a phrase (`reason`); `missing` when there is no file at all, so
    a caller can tell "not there" from "there but unreadable" without comparing the text."""

    def __init__(self, reason: str, *, missing: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.missing = missing


def _os_reason(exc: OSError) -> str:
    if exc.errno == errno.ENOENT:
        return "is missing"
    if exc.errno == errno.ELOOP:
        return "is a symbolic link (links are not followed)"
    if exc.errno == errno.ENOTDIR:
        return "is not a directory"
    return f"cannot be read ({exc.strerror or exc})"


def _open_dir(root: Path) -> int:
    try:
        return os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise Unreadable(f"its directory {_os_reason(exc)}") from None


def read_regular_below(root: Path, rel: str, limit: int) -> bytes:
    """The bytes of regular file `root/rel`, opened without following symlinks or blocking."""
    *dirs, name = rel.split("/")
    fd = _open_dir(root)
    try:
        for part in dirs:
            try:
                info = os.stat(part, dir_fd=fd, follow_symlinks=False)
                if not stat.S_ISDIR(info.st_mode):
                    raise Unreadable(f"{part}/ is {_describe(info.st_mode)}, not a directory")
                inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except OSError as exc:
                raise Unreadable(f"{part}/ {_os_reason(exc)}") from None
            os.close(fd)
            fd = inner
        try:
            info = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if not stat.S_ISREG(info.st_mode):
                raise Unreadable(f"is {_describe(info.st_mode)}, not a regular file")
            file_fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd)
        except OSError as exc:
            raise Unreadable(_os_reason(exc), missing=exc.errno == errno.ENOENT) from None
    finally:
        os.close(fd)
    try:
        info = os.fstat(file_fd)
        if not stat.S_ISREG(info.st_mode):  # swapped between lstat and open
            raise Unreadable(f"is {_describe(info.st_mode)}, not a regular file")
        if info.st_size > limit:
            raise Unreadable(f"is {info.st_size} bytes, more than any build file ({limit} bytes)")
        chunks, total = [], 0
        while chunk := os.read(file_fd, 1 << 20):
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:
                raise Unreadable(f"is more than {limit} bytes, more than any build file")
        return b"".join(chunks)
    except OSError as exc:
        raise Unreadable(_os_reason(exc)) from None
    finally:
        os.close(file_fd)


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
            raise Unreadable("missing", missing=True) from None
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


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"key {key!r} appears twice")
        out[key] = value
    return out


def strict_json(data: bytes) -> Any:
    """Standard JSON only (no NaN/Infinity, no repeated keys); ValueError otherwise."""
    text = data.decode("utf-8")  # UnicodeDecodeError is a ValueError
    try:
        return json.loads(text, parse_constant=_refuse_constant, object_pairs_hook=_no_duplicates)
    except RecursionError:
        raise ValueError("nested too deep") from None


def plain_problem(value: Any, where: str = "") -> str | None:
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


def yaml_document(text: str) -> Any:
    """One YAML document with no anchors or aliases (lmspec writes none; an alias bomb expands)."""
    for event in yaml.parse(text, Loader=_SAFE_LOADER):
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
            mark = event.start_mark
            raise ValueError(f"line {mark.line + 1}: YAML anchors and aliases are not written by lmspec")
    return yaml.load(text, Loader=_SAFE_LOADER)
