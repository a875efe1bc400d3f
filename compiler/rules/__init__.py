"""Layer two of validation: semantic rules, each a small function yielding problems.

Plain tables: RULES judge the whole spec; TRAINING_RULES run only when it trains and read it
narrowed (a TrainingContext), SERVING_RULES only when it serves (a ServingContext).
ACCEPTED_TRAINING_RULES build what an emitter will to judge it, so they run last and only on a spec
that trains and that every other rule accepts. A rule reads
the typed spec, origins and the compile's inputs (compiler/inputs.py), and never
reads the machine nor writes.
"""

from __future__ import annotations

from lmspec.compiler.errors import Problem
from lmspec.compiler.inputs import CompileInputs
from lmspec.compiler.rules import (
    backend,
    batch,
    budget,
    capability,
    checkpoint,
    conversion,
    data,
    experts,
    hardware,
    jobs,
    launch,
    layout,
    megatron_extra,
    model,
    moe_settings,
    overlap,
    quantize,
    run_paths,
    serve_budget,
    serve_scale,
    serving,
    site,
    vllm_extra,
)
from lmspec.compiler.rules.context import RuleContext, ServingContext, TrainingContext
from lmspec.compiler.spec.provenance import Origins
from lmspec.compiler.spec.sections import Spec
from lmspec.compiler.spec.sections import serving as serving_part
from lmspec.compiler.spec.sections import training as training_part

RULES = (
    *jobs.RULES,
    *hardware.RULES,
    *model.RULES,
    *launch.RULES,
    *site.RULES,
    *run_paths.RULES,
    *quantize.RULES,
)
TRAINING_RULES = (
    *model.TRAINING_RULES,
    *layout.RULES,
    *experts.RULES,
    *batch.RULES,
    *capability.RULES,
    *overlap.RULES,
    *moe_settings.RULES,
    *megatron_extra.RULES,
    *backend.RULES,
    *launch.TRAINING_RULES,
    *run_paths.TRAINING_RULES,
    *data.RULES,
    *budget.RULES,
    *checkpoint.RULES,
)
SERVING_RULES = (*serving.RULES, *quantize.SERVING_RULES, *serve_scale.RULES, *vllm_extra.RULES, *serve_budget.RULES)
ACCEPTED_TRAINING_RULES = (*conversion.RULES,)


def rule_problems(spec: Spec, origins: Origins, inputs: CompileInputs) -> list[Problem]:
    """Every rule's problems, in table order; `inputs` is what the compile read from the machine."""
    problems = [problem for rule in RULES for problem in rule(RuleContext(spec, origins, inputs))]
    if (trains := training_part(spec)) is not None:
        ctx = TrainingContext(trains, origins, inputs)
        problems += [problem for rule in TRAINING_RULES for problem in rule(ctx)]
    if (serves := serving_part(spec)) is not None:
        serve_ctx = ServingContext(serves, origins, inputs)
        problems += [problem for rule in SERVING_RULES for problem in rule(serve_ctx)]
    if trains is not None and not any(p.severity == "error" for p in problems):
        problems += [problem for rule in ACCEPTED_TRAINING_RULES for problem in rule(ctx)]
    return problems
