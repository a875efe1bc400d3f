"""spec + overrides -> Plan: the three steps every command shares."""

from __future__ import annotations

from pathlib import Path

from compiler.load import compose_spec
from compiler.plan import Plan, build_plan
from compiler.validate import validate


def make_plan(overrides: list[str], spec_file: Path | None = None) -> Plan:
    composed = compose_spec(overrides, spec_file)
    spec, warnings = validate(composed)
    return build_plan(spec, composed, warnings)
