"""`lmspec check`: validate a spec and report every problem at once; writes nothing."""

from __future__ import annotations

import argparse

from lmspec.compiler.cli.spec_args import add_spec_args
from lmspec.compiler.errors import EXIT_OK, print_problems


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("check", help="validate only: every problem at once")
    add_spec_args(p)
    p.set_defaults(handler=_cmd_check)


def _cmd_check(args: argparse.Namespace) -> int:
    from lmspec.compiler.pipeline import make_plan

    plan = make_plan(list(args.overrides), args.spec)
    print_problems(plan.warnings)
    print(
        f"{plan.name}: valid ({plan.layout.world_size} ranks: tp {plan.layout.tp} x pp {plan.layout.pp} "
        f"x dp {plan.layout.dp} x cp {plan.layout.cp}; {len(plan.warnings)} warnings)"
    )
    return EXIT_OK
