"""`lmspec explain`: the resolved spec with the origin of every value, and the derived numbers."""

from __future__ import annotations

import json
from typing import Any

from lmspec.compiler.models.steptime import estimate_step_time
from lmspec.compiler.models.summary import step_time_dict
from lmspec.compiler.models.table import memory_table_text
from lmspec.compiler.plan import Plan
from lmspec.compiler.spec.provenance import Origins


def _leaves(node: Any, prefix: str = "") -> list[tuple[str, Any]]:
    if isinstance(node, dict):
        out = []
        for key, value in node.items():
            out += _leaves(value, f"{prefix}.{key}" if prefix else key)
        return out
    return [(prefix, node)]


def _derived(plan: Plan) -> dict[str, Any]:
    """plan.json's numbers, and the step time `lmspec plan` gives this layout (not in plan.json)."""
    step = estimate_step_time(plan.spec, plan.memory)
    return {**plan.derived_dict(), **({"step_time": step_time_dict(step)} if step is not None else {})}


def explain_text(plan: Plan, origins: Origins) -> str:
    rows = [(key, json.dumps(value), origins.of(key)) for key, value in _leaves(plan.spec_dict())]
    width_key = max(len(r[0]) for r in rows)
    width_value = min(max(len(r[1]) for r in rows), 40)
    lines = [f"{k:<{width_key}}  {v:<{width_value}}  # {o}" for k, v, o in rows]
    lines.append("")
    lines.append("derived:")
    lines += [f"  {k:<{width_key}}  {json.dumps(v)}" for k, v in _leaves(_derived(plan))]
    lines += ["", memory_table_text(plan.memory, "training memory per GPU (worst stage)")]
    return "\n".join(lines)


def explain_json(plan: Plan, origins: Origins) -> str:
    spec = plan.spec_dict()
    document = {"spec": spec, "origins": {k: origins.of(k) for k, _ in _leaves(spec)}, **_derived(plan)}
    return json.dumps(document, indent=2, sort_keys=True)
