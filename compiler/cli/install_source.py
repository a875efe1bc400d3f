"""Where this copy of lmspec came from, as the requirement a team's CI installs (`lmspec init`).

The CI must compile with the lmspec that compiled the committed build/ (manifest.json records
the version), and from a source the CI runner can reach. pip records how it installed a
package in its `direct_url.json` (PEP 610): none for an index, a VCS URL and commit, an
archive, or a local directory (whose git remote, at the checked-out commit, is what a
runner can fetch).
"""

from __future__ import annotations

import json
import subprocess
import urllib.parse
import urllib.request
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class InstallSource:
    requirement: str  # what `pip install` takes
    origin: str  # where it came from, in words
    reachable: bool  # False: a path on this machine, which a CI runner cannot install


def given(requirement: str) -> InstallSource:
    """A requirement the user names (`lmspec init --install`): a mirror or wheel only they know."""
    return InstallSource(requirement, "what `lmspec init --install` named", True)


def this_install() -> InstallSource:
    # A checkout's own lmspec.egg-info (setuptools' editable build leaves one) is found first when the
    # checkout is on sys.path, and has no record: the installed dist-info beside it has.
    dists = list(metadata.distributions(name="lmspec"))
    recorded = [(d, text) for d in dists if (text := d.read_text("direct_url.json"))]
    if recorded:
        return install_source(json.loads(recorded[0][1]), recorded[0][0].version)
    from lmspec.compiler import __version__

    return install_source(None, dists[0].version if dists else __version__)


def install_source(direct_url: dict[str, Any] | None, version: str) -> InstallSource:
    """The requirement for a PEP 610 record (None: installed from a package index)."""
    if direct_url is None:
        return InstallSource(f"lmspec=={version}", f"a package index (lmspec {version})", True)
    url: str = direct_url["url"]
    subdirectory = direct_url.get("subdirectory")
    if (vcs := direct_url.get("vcs_info")) is not None:
        return _from_vcs(f"{vcs['vcs']}+{url}", vcs["commit_id"], subdirectory, local=url.startswith("file:"))
    if "dir_info" in direct_url and url.startswith("file:"):
        directory = Path(urllib.request.url2pathname(urllib.parse.urlparse(url).path))
        if (checkout := _git_checkout(directory)) is not None:
            return checkout
        where = f"the directory {directory} on this machine, not a git checkout with a remote"
        return InstallSource(f"lmspec @ {url}", where, False)
    local = url.startswith("file:")
    return InstallSource(f"lmspec @ {url}", f"the archive {url}" + (" on this machine" if local else ""), not local)


def _from_vcs(vcs_url: str, commit: str, subdirectory: str | None, *, local: bool, note: str = "") -> InstallSource:
    fragment = f"#subdirectory={subdirectory}" if subdirectory else ""
    here = ", a repository on this machine," if local else ""
    where = f"{vcs_url.split('+', 1)[1]}{here} at commit {commit[:12]}{note}"
    return InstallSource(f"lmspec @ {vcs_url}@{commit}{fragment}", where, not local)


def _git(directory: Path, *argv: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(directory), *argv], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _git_checkout(directory: Path) -> InstallSource | None:
    """A directory install from a git checkout: its remote at the checked-out commit."""
    top, commit = _git(directory, "rev-parse", "--show-toplevel"), _git(directory, "rev-parse", "HEAD")
    if not top or not commit:
        return None
    remotes = (_git(directory, "remote") or "").split()
    if not remotes:
        return None
    remote = _git(directory, "remote", "get-url", "origin" if "origin" in remotes else remotes[0]) or ""
    url, local = pip_git_url(remote, Path(top))
    sub = directory.resolve().relative_to(Path(top).resolve()).as_posix()
    dirty = "; uncommitted changes in that checkout are not in it" if _git(directory, "status", "--porcelain") else ""
    return _from_vcs(f"git+{url}", commit, None if sub == "." else sub, local=local, note=dirty)


def pip_git_url(remote: str, top: Path) -> tuple[str, bool]:
    """(a URL pip's git+ scheme takes, whether it is on this machine) for a git remote as
    `git remote get-url` prints it: scp-like `user@host:path`, a URL, or a path."""
    if "://" in remote:
        return remote, remote.startswith("file:")
    host, colon, path = remote.partition(":")
    if colon and "/" not in host and len(host) > 1:  # scp-like; a one-letter "host" is a Windows drive
        return f"ssh://{host}/{path}", False
    return (top / remote).resolve().as_uri(), True
