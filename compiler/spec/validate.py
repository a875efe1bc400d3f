"""Validate a composed spec in two layers and return the typed Spec plus its warnings."""

from __future__ import annotations

from lmspec.compiler.errors import Problem, SpecError
from lmspec.compiler.rules import rule_problems
from lmspec.compiler.spec.load import Composed
from lmspec.compiler.spec.schema_check import schema_problems
from lmspec.compiler.spec.sections import Spec
from lmspec.compiler.spec.typed import from_dict


def validate(composed: Composed) -> tuple[Spec, list[Problem]]:
    """Schema first (shape), then every semantic rule; raise SpecError listing all errors."""
    spec, problems = validate_shape(composed)
    if any(p.severity == "error" for p in problems):
        raise SpecError(problems)
    return spec, problems


def validate_shape(composed: Composed) -> tuple[Spec, list[Problem]]:
    """The typed Spec and every rule's problems, errors included; SpecError only for a wrong shape
    (the schema), which leaves no typed Spec to check."""
    problems = schema_problems(composed.spec, composed.origins)
    if problems:
        raise SpecError(problems)
    spec = from_dict(Spec, composed.spec)
    return spec, rule_problems(spec, composed.origins)
