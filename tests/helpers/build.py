"""Compile a build in this process, as `lmspec compile -o ROOT [--spec SPEC] OVERRIDES...` writes it."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from lmspec.compiler.build.writer import write_build
from lmspec.compiler.emit.manifest import build_files
from lmspec.compiler.pipeline import make_plan
from lmspec.compiler.plan import Plan


class Compiled(NamedTuple):
    plan: Plan
    dir: Path


def compile_build(root: Path, overrides: Sequence[str] = (), spec: str | Path | None = None) -> Compiled:
    """Write the build of `spec` (a preset name or a file; default the built-in spec) at root/<name>."""
    plan = make_plan(list(overrides), Path(spec) if spec else None)
    target = root / plan.name
    write_build(target, build_files(plan))
    return Compiled(plan, target)
