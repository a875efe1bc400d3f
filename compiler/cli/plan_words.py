"""The words `lmspec plan` prints and checks, shared by the training search (cli/plan.py) and the
serving one (cli/plan_serve.py): the winner's overrides, their shell spelling, and the problems
`lmspec check` finds in them."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path
from typing import Any


def job_overrides(args: argparse.Namespace, winner: list[str]) -> list[str]:
    """Overrides that build the winner: the user's (minus the searched keys), then the layout's."""
    searched = {o.split("=", 1)[0] for o in winner}
    kept = [o for o in args.overrides if o.lstrip("+~").split("=", 1)[0] not in searched]
    return [*kept, *winner]


def shell(words: list[str]) -> str:
    return " ".join(shlex.quote(w) for w in words)


def spec_words(args: argparse.Namespace) -> list[str]:
    return ["--spec", str(args.spec)] if args.spec is not None else []


def problems_of(job: list[str], spec_file: Path | None) -> tuple[list[Any], bool]:
    """Every problem of `lmspec check` on the job, and whether one is an error."""
    from lmspec.compiler.errors import SpecError
    from lmspec.compiler.pipeline import make_plan

    try:
        return list(make_plan(job, spec_file).warnings), False
    except SpecError as exc:
        return list(exc.problems), True
