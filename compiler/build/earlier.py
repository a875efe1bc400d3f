"""The build already on disk, as a source of files a compile may keep instead of redrawing.

A file is offered only while its bytes still hash to what that build's manifest recorded,
so a hand-edited artifact is never carried into a new build.

Every read of a directory lmspec may not have written (the earlier build, `compile --check`,
the ownership test of compiler/build/ownership.py) goes through compiler/build/safe_read.py's
`read_regular`: it never follows a final symlink, never blocks on a FIFO, reads regular files
only and at most READ_LIMIT_BYTES, and reports every failure as `Unreadable` with a short reason
instead of an exception a user would see as a traceback.
"""

from __future__ import annotations

import json
from pathlib import Path

from lmspec.compiler.build.digest import sha256
from lmspec.compiler.build.files import MANIFEST
from lmspec.compiler.build.safe_read import Unreadable, read_regular


def manifest_files(root: Path, manifest: str = MANIFEST) -> dict[str, object]:
    """The `files` table of `root/manifest` (relative path -> what it recorded: a sha256, a size);
    raises Unreadable."""
    try:
        doc = json.loads(read_regular(root / manifest).decode("utf-8"))
    except Unreadable as exc:
        raise Unreadable(
            f"no {manifest}" if exc.missing else f"{manifest} is {exc.reason}", missing=exc.missing
        ) from None
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
