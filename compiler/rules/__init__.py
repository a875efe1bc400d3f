"""Layer two of validation: semantic rules, each a small function yielding problems.

Three plain tables: RULES judge the whole spec; TRAINING_RULES run only when it trains and read it
narrowed (a TrainingContext), SERVING_RULES only when it serves (a ServingContext). A rule reads
the typed spec and origins and never writes.
"""

from __future__ import annotations

from lmspec.compiler.errors import Problem
from lmspec.compiler.rules import (
    backend,
    batch,
    budget,
    capability,
    checkpoint,
    data,
    experts,
    jobs,
    launch,
    layout,
    model,
    overlap,
    run_paths,
    serve_budget,
    serving,
    site,
)
from lmspec.compiler.rules.context import RuleContext, ServingContext, TrainingContext
from lmspec.compiler.spec.provenance import Origins
from lmspec.compiler.spec.sections import Spec
from lmspec.compiler.spec.sections import serving as serving_part
from lmspec.compiler.spec.sections import training as training_part

RULES = (*jobs.RULES, *model.RULES, *launch.RULES, *site.RULES, *run_paths.RULES)
TRAINING_RULES = (
    *model.TRAINING_RULES,
    *layout.RULES,
    *experts.RULES,
    *batch.RULES,
    *capability.RULES,
    *overlap.RULES,
    *backend.RULES,
    *launch.TRAINING_RULES,
    *run_paths.TRAINING_RULES,
    *data.RULES,
    *budget.RULES,
    *checkpoint.RULES,
)
SERVING_RULES = (*serving.RULES, *serve_budget.RULES)


def rule_problems(spec: Spec, origins: Origins) -> list[Problem]:
    problems = [problem for rule in RULES for problem in rule(RuleContext(spec, origins))]
    if (trains := training_part(spec)) is not None:
        ctx = TrainingContext(trains, origins)
        problems += [problem for rule in TRAINING_RULES for problem in rule(ctx)]
    if (serves := serving_part(spec)) is not None:
        serve_ctx = ServingContext(serves, origins)
        problems += [problem for rule in SERVING_RULES for problem in rule(serve_ctx)]
    return problems
