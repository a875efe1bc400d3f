"""Which of lmspec's serving rules refuses a serving candidate: the rule functions themselves, run on it.

The serving space is small (tens to a few thousand engines), so unlike the training search it needs no
array mirror of the rules: each candidate's spec goes through every serving rule in the validator's order
(rules.SERVING_RULES, so a rule added there is searched too), and the first one yielding an error names the
refusal, as `lmspec check` would report it. A warning does not refuse: the winner's command is checked
whole before it is printed, and its warnings are shown.

The memory budget (rules/serve_budget.py) is left to serve_evaluate, which judges it with the model the
rule reads (estimate_serve_memory, needed for pricing anyway): the rule computes its fixes (a memory
estimate for each longer pipeline) before it yields, which costs more than the whole search where many
layouts do not fit. tests/plan/test_serve_plan.py checks that the rule and the search refuse the same ones.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from lmspec.compiler.errors import Problem
from lmspec.compiler.rules import SERVING_RULES, serve_budget
from lmspec.compiler.rules.context import ServingContext
from lmspec.compiler.spec.provenance import Origins
from lmspec.compiler.spec.sections import ServingSpec

Rule = Callable[[ServingContext], Iterator[Problem]]
LAYOUT_RULES: tuple[Rule, ...] = tuple(r for r in SERVING_RULES if r not in serve_budget.RULES)
BUDGET_RULE = "serve_budget.serving_fits_memory"


def rule_name(rule: Any) -> str:
    """`serving.serve_tp_divides_heads`: module and function, as the training search names its checks."""
    return f"{rule.__module__.rsplit('.', 1)[-1]}.{rule.__name__}"


def refusal(spec: ServingSpec, origins: Origins) -> str | None:
    """The first serving rule (but the memory budget) that finds an error in `spec`, or None."""
    ctx = ServingContext(spec, origins)
    for rule in LAYOUT_RULES:
        if any(problem.severity == "error" for problem in rule(ctx)):
            return rule_name(rule)
    return None
