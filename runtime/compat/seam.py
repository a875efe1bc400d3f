"""What every compat module does: check the upstream version it was written for, swap one attribute for a while.

A compat module patches code it does not own, so it says which release it read (`require` when
running on another release would give wrong results or a crash far from here, `expect` when the
patch is an optimisation the upstream can do without) and undoes each patch when its block ends
(`swapped`; `defined` for a name the upstream leaves undefined), so code that runs later sees the
upstream exactly as installed.
"""

from __future__ import annotations

import importlib.metadata
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

log = logging.getLogger(__name__)


class UpstreamVersionError(RuntimeError):
    """An upstream library is installed at a release a compat module was not written for."""


def installed_version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def version_matches(version: str, expected: str) -> bool:
    """`expected` is a release (`0.16.1`) or a release series (`0.32.*`); a local part (`+cpu`) is ignored."""
    release = version.split("+", 1)[0]
    if expected.endswith(".*"):
        return release.startswith(expected[:-1])
    return release == expected


def version_problem(seam: str, distribution: str, expected: str) -> str | None:
    """Why `distribution` is not what `seam` was written for, or None when it is."""
    version = installed_version(distribution)
    if version is not None and version_matches(version, expected):
        return None
    have = f"{distribution} {version} is installed" if version else f"{distribution} is not installed"
    return f"{have}, but {seam} was written for {distribution} {expected} (the pin in lmspec's pyproject.toml)"


def require(seam: str, distribution: str, expected: str) -> None:
    """Raise UpstreamVersionError unless `distribution` is at `expected` (a patch that must be exact)."""
    problem = version_problem(seam, distribution, expected)
    if problem is not None:
        raise UpstreamVersionError(f"{problem}; install {distribution}=={expected.replace('*', '0')} or update {seam}")


def expect(seam: str, distribution: str, expected: str, otherwise: str) -> bool:
    """Whether `distribution` is at `expected`; if not, one warning ending in `otherwise` (what the
    caller does instead), for a patch the upstream can do without."""
    problem = version_problem(seam, distribution, expected)
    if problem is not None:
        log.warning("%s; %s", problem, otherwise)
    return problem is None


@contextmanager
def swapped(owner: Any, name: str, value: Any) -> Iterator[Any]:
    """`owner.name` is `value` inside the block and the original after it; yields the original.
    An attribute the upstream no longer has is an AttributeError here, not a patch of nothing."""
    original = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield original
    finally:
        setattr(owner, name, original)


@contextmanager
def defined(owner: Any, name: str, value: Any) -> Iterator[None]:
    """`owner.name` is `value` inside the block, where the upstream leaves that name undefined (a global
    set only on an import path not taken); deleted after. A name the upstream now defines is an
    AttributeError here: the patch is no longer needed, retire it."""
    if hasattr(owner, name):
        raise AttributeError(f"{getattr(owner, '__name__', owner)!s}.{name} is defined upstream now")
    setattr(owner, name, value)
    try:
        yield
    finally:
        delattr(owner, name)
