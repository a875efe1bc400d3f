"""`lmspec explain`: the resolved spec with the origin of every value, and the derived numbers."""

from __future__ import annotations

import argparse
import json
from typing import Any

from lmspec.compiler.cli.help_text import described
from lmspec.compiler.cli.spec_args import add_spec_args
from lmspec.compiler.errors import EXIT_OK, print_problems
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
    """plan.json's numbers (a part the job lacks is null), and the step time `lmspec plan` gives a
    training layout (not in plan.json)."""
    step = estimate_step_time(plan.train.spec, plan.train.memory) if plan.train else None
    return {**plan.derived_dict(), **({"step_time": step_time_dict(step)} if step is not None else {})}


def explain_text(plan: Plan, origins: Origins) -> str:
    rows = [(key, json.dumps(value), origins.of(key)) for key, value in _leaves(plan.spec_dict())]
    width_key = max(len(r[0]) for r in rows)
    width_value = min(max(len(r[1]) for r in rows), 40)
    lines = [f"{k:<{width_key}}  {v:<{width_value}}  # {o}" for k, v, o in rows]
    lines.append("")
    lines.append("derived:")
    present = {part: numbers for part, numbers in _derived(plan).items() if numbers is not None}
    lines += [f"  {k:<{width_key}}  {json.dumps(v)}" for k, v in _leaves(present)]
    if plan.train:
        lines += ["", memory_table_text(plan.train.memory, "training memory per GPU (worst stage)")]
    return "\n".join(lines)


def explain_json(plan: Plan, origins: Origins) -> str:
    spec = plan.spec_dict()
    document = {"spec": spec, "origins": {k: origins.of(k) for k, _ in _leaves(spec)}, **_derived(plan)}
    return json.dumps(document, indent=2, sort_keys=True)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "explain",
        help="the resolved spec with where each value came from, and derived numbers",
        **described(
            "Print the resolved spec, each value with the file and line (or override) it came from, and the "
            "numbers lmspec derives from it: parameters, memory per GPU by term, FLOPs, communication.",
            "lmspec explain",
            "lmspec explain model=deepseek_v3 hardware=h800_80g hardware.nodes=256 parallel.pp=16 parallel.ep=64",
            "lmspec explain --spec specs/llama3_70b_pretrain_64gpu_h100_bf16.yaml --format json",
        ),
    )
    add_spec_args(p)
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.set_defaults(handler=_cmd_explain)


def _cmd_explain(args: argparse.Namespace) -> int:
    from lmspec.compiler.plan import build_plan
    from lmspec.compiler.spec.load import compose_spec
    from lmspec.compiler.spec.validate import validate

    composed = compose_spec(list(args.overrides), args.spec)
    spec, warnings = validate(composed)
    plan = build_plan(spec, composed, warnings)
    if args.format == "json":
        print(explain_json(plan, composed.origins))
    else:
        print_problems(plan.warnings)
        print(explain_text(plan, composed.origins))
    return EXIT_OK
