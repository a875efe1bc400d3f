"""Layer two of validation: semantic rules, each a small function yielding problems.

RULES is a plain table; a rule reads the typed spec and origins and never writes.
"""

from __future__ import annotations

from lmspec.compiler.errors import Problem
from lmspec.compiler.rules import (
    backend,
    batch,
    budget,
    capability,
    data,
    experts,
    launch,
    layout,
    model,
    run_paths,
    serving,
)
from lmspec.compiler.rules.context import RuleContext
from lmspec.compiler.spec.provenance import Origins
from lmspec.compiler.spec.sections import Spec

RULES = (
    *model.RULES,
    *layout.RULES,
    *experts.RULES,
    *batch.RULES,
    *capability.RULES,
    *backend.RULES,
    *serving.RULES,
    *launch.RULES,
    *run_paths.RULES,
    *data.RULES,
    *budget.RULES,
)


def rule_problems(spec: Spec, origins: Origins) -> list[Problem]:
    ctx = RuleContext(spec, origins)
    return [problem for rule in RULES for problem in rule(ctx)]
