"""`lmspec explain`: the resolved spec with the origin of every value, and the derived numbers."""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import TYPE_CHECKING, Any

from lmspec.compiler.cli.help_text import described
from lmspec.compiler.cli.spec_args import add_spec_args
from lmspec.compiler.emit.report_checkpoint import checkpoint_line
from lmspec.compiler.errors import EXIT_FAILED, EXIT_OK, print_problems
from lmspec.compiler.models.summary import params_dict, step_estimate, throughput_dict
from lmspec.compiler.models.table import memory_table_text

if TYPE_CHECKING:
    from lmspec.compiler.pipeline import Derived


def _leaves(node: Any, prefix: str = "") -> list[tuple[str, Any]]:
    if isinstance(node, dict):
        out = []
        for key, value in node.items():
            out += _leaves(value, f"{prefix}.{key}" if prefix else key)
        return out
    return [(prefix, node)]


def _derived(derived: Derived) -> dict[str, Any]:
    """plan.json's numbers (a part the job lacks is null), and the step time `lmspec plan` gives a
    training layout (not in plan.json); only the parameters when the layout does not divide."""
    plan = derived.plan
    if plan is None:
        return {"params": params_dict(derived.params)} if derived.params is not None else {}
    train = plan.train
    step = {"throughput": throughput_dict(step_estimate(train.flops, train.step_time))} if train else {}
    return {**plan.derived_dict(), **step}


def explain_text(derived: Derived) -> str:
    rows = [(key, json.dumps(value), derived.origins.of(key)) for key, value in _leaves(derived.spec)]
    width_key = max(len(r[0]) for r in rows)
    width_value = min(max(len(r[1]) for r in rows), 40)
    lines = [f"{k:<{width_key}}  {v:<{width_value}}  # {o}" for k, v, o in rows]
    lines.append("")
    lines.append("derived:")
    present = {part: numbers for part, numbers in _derived(derived).items() if numbers is not None}
    lines += [f"  {k:<{width_key}}  {json.dumps(v)}" for k, v in _leaves(present)] or ["  nothing: see the errors"]
    if derived.plan is not None and derived.plan.train:
        train = derived.plan.train
        lines += ["", memory_table_text(train.memory, "training memory per GPU (worst stage)"), checkpoint_line(train)]
    return "\n".join(lines)


def explain_json(derived: Derived) -> str:
    document = {
        "spec": derived.spec,
        "origins": {k: derived.origins.of(k) for k, _ in _leaves(derived.spec)},
        "problems": [dataclasses.asdict(p) for p in derived.problems],
        **_derived(derived),
    }
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
    """The document is whole whatever the spec breaks: the problems go with it (stderr for text,
    `problems` in JSON), and the exit code says whether any is an error."""
    from lmspec.compiler.pipeline import derive_despite_rules

    derived = derive_despite_rules(list(args.overrides), args.spec)
    derived = dataclasses.replace(
        derived, problems=tuple(sorted(derived.problems, key=lambda p: p.severity != "error"))
    )
    if args.format == "json":
        print(explain_json(derived))
    else:
        print_problems(derived.problems)
        print(explain_text(derived))
    return EXIT_FAILED if any(p.severity == "error" for p in derived.problems) else EXIT_OK
