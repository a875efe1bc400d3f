"""The build already on disk, as a source of files a compile may keep instead of redrawing.

A file is offered only while its bytes still hash to what that build's manifest recorded,
so a hand-edited artifact is never carried into a new build.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

MANIFEST = "manifest.json"


class EarlierBuild:
    """Read-only view of `root` (which may not exist): files still as its manifest recorded them."""

    def __init__(self, root: Path) -> None:
        self.root = root
        try:
            recorded = json.loads((root / MANIFEST).read_text(encoding="utf-8"))["files"]
        except (OSError, ValueError, KeyError, TypeError):
            recorded = {}
        self._recorded: dict[str, str] = recorded if isinstance(recorded, dict) else {}

    def file(self, rel: str) -> str | None:
        """The text of `rel`, or None when absent, unreadable or changed since it was written."""
        expected = self._recorded.get(rel)
        if expected is None:
            return None
        try:
            data = (self.root / rel).read_bytes()
        except OSError:
            return None
        if hashlib.sha256(data).hexdigest() != expected:
            return None
        return data.decode("utf-8")
