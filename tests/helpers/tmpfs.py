"""Small file systems a test mounts to make a disk full or read-only for real (root only), always unmounted.

Root ignores permission bits, so a read-only directory is a read-only mount, not a chmod.
"""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

import pytest


def mount_tmpfs(request: pytest.FixtureRequest, where: Path, size_kib: int) -> Path:
    """A tmpfs of `size_kib` KiB at `where` (created), unmounted when the test ends; the test is skipped, with
    the reason, where this process may not mount one."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs (a real full or read-only disk) needs root")
    where.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_kib}k,mode=755", "tmpfs", str(where)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip() or done.returncode}")
    request.addfinalizer(lambda: subprocess.run(["umount", "-l", str(where)], check=False, capture_output=True))
    return where


def fill(directory: Path) -> None:
    """Write `directory`/fill until its file system has no block left."""
    with open(directory / "fill", "wb", buffering=0) as fh:
        block = bytes(4096)
        try:
            while True:
                fh.write(block)
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise


def remount_read_only(where: Path) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(where)], check=True, capture_output=True)
