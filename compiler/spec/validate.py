"""Validate a composed spec in two layers: its shape (the schema), then its meaning (the rules)."""

from __future__ import annotations

from lmspec.compiler.errors import Problem, SpecError
from lmspec.compiler.inputs import CompileInputs
from lmspec.compiler.rules import rule_problems
from lmspec.compiler.spec.load import Composed
from lmspec.compiler.spec.provenance import Origins
from lmspec.compiler.spec.schema_check import schema_problems
from lmspec.compiler.spec.sections import Spec
from lmspec.compiler.spec.typed import from_dict


def typed_spec(composed: Composed) -> Spec:
    """Layer one, the schema: the typed Spec, or SpecError listing every problem of shape (a spec of
    the wrong shape leaves no typed Spec to check)."""
    problems = schema_problems(composed.spec, composed.origins)
    if problems:
        raise SpecError(problems)
    return from_dict(Spec, composed.spec)


def validate(spec: Spec, origins: Origins, inputs: CompileInputs) -> list[Problem]:
    """Layer two, every semantic rule against what the compile read (compiler/inputs.py): the
    warnings; SpecError listing all problems when any is an error."""
    problems = rule_problems(spec, origins, inputs)
    if any(p.severity == "error" for p in problems):
        raise SpecError(problems)
    return problems
