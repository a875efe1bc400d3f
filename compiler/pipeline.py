"""spec + overrides -> Plan: the three steps every command shares."""

from __future__ import annotations

from pathlib import Path

from lmspec.compiler.plan import Plan, build_plan
from lmspec.compiler.spec.load import compose_spec
from lmspec.compiler.spec.validate import validate


def make_plan(overrides: list[str], spec_file: Path | None = None) -> Plan:
    composed = compose_spec(overrides, spec_file)
    spec, warnings = validate(composed)
    return build_plan(spec, composed, warnings)
