"""The rules of the spec's own training backend (lmspec.compiler.backends: each module declares its own),
beyond what the capability table (rules/capability.py) refuses; no rule here compares backend names."""

from __future__ import annotations

from collections.abc import Iterator

from lmspec.compiler.backends import backend_of
from lmspec.compiler.errors import Problem
from lmspec.compiler.rules.context import TrainingContext


def chosen_backend(ctx: TrainingContext) -> Iterator[Problem]:
    for rule in backend_of(ctx.spec).rules:
        yield from rule(ctx)


RULES = (chosen_backend,)
