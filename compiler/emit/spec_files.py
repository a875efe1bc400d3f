"""spec.resolved.yaml (what was compiled) and plan.json (what lmspec derived from it)."""

from __future__ import annotations

import json

import yaml

from compiler.plan import Plan

_Dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)  # libyaml: same text, 4x faster
SCHEMA_HEADER = "# yaml-language-server: $schema=https://lmspec.dev/schemas/spec.schema.json\n"


def dump_json(data: object) -> str:
    """Stable JSON for artifacts: sorted keys, two-space indent, trailing newline."""
    return json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def emit_resolved_spec(plan: Plan) -> dict[str, str]:
    body = yaml.dump(
        plan.spec_dict(), Dumper=_Dumper, sort_keys=False, default_flow_style=False, allow_unicode=True, width=1000
    )
    header = (
        "# The resolved spec this build was compiled from (every default, group choice and\n"
        "# override applied). The runtime reads it; `lmspec compile --spec` accepts it unchanged.\n"
    )
    return {"spec.resolved.yaml": SCHEMA_HEADER + header + body}


def emit_plan_json(plan: Plan) -> dict[str, str]:
    return {"plan.json": dump_json({"lmspec_version": plan.lmspec_version, **plan.derived_dict()})}
