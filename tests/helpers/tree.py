"""Exact before/after states of directories: proof that nothing else was touched.

Imported as `from helpers.tree import snapshot`.
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path


def snapshot(root: Path) -> dict[str, str]:
    """Relative path -> what it is: `file <sha256> <mode>`, `dir <mode>`, `link -> <target>`, `fifo`.

    The root itself is included under ".", so a file or symlink in place of a directory is seen too;
    a missing root snapshots as {}.
    """
    state: dict[str, str] = {}
    if not os.path.lexists(root):
        return state

    def describe(path: Path) -> str:
        info = path.lstat()
        mode = oct(stat.S_IMODE(info.st_mode))
        if stat.S_ISLNK(info.st_mode):
            return f"link -> {os.readlink(path)}"
        if stat.S_ISDIR(info.st_mode):
            return f"dir {mode}"
        if stat.S_ISREG(info.st_mode):
            return f"file {hashlib.sha256(path.read_bytes()).hexdigest()} {mode}"
        return "fifo" if stat.S_ISFIFO(info.st_mode) else f"special {info.st_mode:o}"

    state["."] = describe(root)
    if root.is_dir() and not root.is_symlink():
        for dirpath, dirnames, filenames in os.walk(root):
            for name in sorted(dirnames + filenames):
                path = Path(dirpath, name)
                state[path.relative_to(root).as_posix()] = describe(path)
    return state
