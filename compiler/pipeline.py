"""spec + overrides -> Plan -> build: the steps every command shares.

`make_plan` is the steps from a spec to a checked Plan: compose, the schema, the compile's inputs
(compiler/inputs.py: everything a compile reads from the machine, read once, here, before the
rules and the Plan), the rules, the Plan. `compile_one` carries one spec
on to the build it makes; `lmspec compile`, the sweep (`compile -m`), `lmspec hook
compile-check` and `lmspec init` all compile through it and differ only in what they report.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from lmspec.compiler.errors import Problem, SpecError, print_problems
from lmspec.compiler.inputs import CompileInputs, read_inputs
from lmspec.compiler.models.dims import ParallelDims
from lmspec.compiler.models.params import ParamCounts, count_params
from lmspec.compiler.plan import Plan, build_plan, spec_dict
from lmspec.compiler.rules import rule_problems
from lmspec.compiler.spec.load import Composed, compose_spec
from lmspec.compiler.spec.provenance import Origins
from lmspec.compiler.spec.sections import Spec, training
from lmspec.compiler.spec.validate import typed_spec, validate


def make_plan(overrides: list[str], spec_file: Path | None = None) -> Plan:
    return plan_from(compose_spec(overrides, spec_file))


def checked(
    composed: Composed, build_dir: Callable[[str], Path] | None = None
) -> tuple[Spec, CompileInputs, list[Problem]]:
    """The typed spec, what compiling it reads from this machine, and its warnings; SpecError lists
    every error. `build_dir` names the build a spec of that name replaces or is checked against
    (its memory chart is one of the inputs); None: no earlier build."""
    spec = typed_spec(composed)
    inputs = read_inputs(spec, build_dir(spec.name) if build_dir is not None else None)
    return spec, inputs, validate(spec, composed.origins, inputs)


def plan_from(composed: Composed, build_dir: Callable[[str], Path] | None = None) -> Plan:
    """The checked Plan of a composed spec (see `checked`)."""
    spec, inputs, warnings = checked(composed, build_dir)
    return build_plan(spec, composed, warnings, inputs)


@dataclass(frozen=True)
class Derived:
    """Everything lmspec can derive from a spec however broken it is: `explain` prints it beside the
    problems, and `logs` reads a log against it. Each stage needs what the one before gave."""

    spec: dict[str, Any]  # the resolved spec, as typed sections when the schema accepts it
    origins: Origins
    problems: tuple[Problem, ...]  # in the order the rules ran
    params: ParamCounts | None  # None when the schema refuses the spec: no typed model to count
    plan: Plan | None  # None also when the training layout does not divide: no stages, no memory


def derive_despite_rules(overrides: list[str], spec_file: Path | None = None) -> Derived:
    composed = compose_spec(overrides, spec_file)
    try:
        spec = typed_spec(composed)
    except SpecError as exc:
        return Derived(composed.spec, composed.origins, tuple(exc.problems), None, None)
    inputs = read_inputs(spec)
    problems = tuple(rule_problems(spec, composed.origins, inputs))
    trains = training(spec)
    if trains is not None and ParallelDims.from_spec(trains) is None:
        return Derived(spec_dict(spec), composed.origins, problems, count_params(spec.model), None)
    plan = build_plan(spec, composed, list(problems), inputs)
    return Derived(plan.spec_dict(), composed.origins, problems, plan.params, plan)


def plan_despite_rules(overrides: list[str], spec_file: Path | None = None) -> Plan:
    """The Plan of a spec that may break a rule (its `warnings` then hold the errors too), for reading a
    log against a job described by flags: FLOPs and GPU counts do not need a job that fits. A spec of
    the wrong shape, or a training layout that does not divide, has no numbers: SpecError."""
    derived = derive_despite_rules(overrides, spec_file)
    if derived.plan is None:
        raise SpecError(list(derived.problems))
    return derived.plan


class Compiled:
    """One spec compiled in memory: its checked Plan, the build directory it makes, and that build's
    files, emitted on first use (a plain `check` of the plan never draws the chart)."""

    def __init__(self, plan: Plan, target: Path) -> None:
        self.plan = plan
        self.target = target

    @cached_property
    def files(self) -> dict[str, str]:
        from lmspec.compiler.emit.manifest import build_files

        return build_files(self.plan)

    def stale(self) -> list[str]:
        """Each file on disk that differs from this compile, with why (`compile --check`); [] when up to date."""
        from lmspec.compiler.build.writer import stale_files

        return stale_files(self.target, self.files)

    def write(self) -> None:
        """Put the build in place, replacing an earlier lmspec build whole."""
        from lmspec.compiler.build.writer import write_build

        write_build(self.target, self.files)


def compile_one(
    spec_file: Path | None,
    overrides: Sequence[str],
    output: Path,
    *,
    check: bool,
    dir_name: Callable[[str], str] | None = None,
    print_warnings: bool = True,
) -> Compiled:
    """spec + overrides -> checked Plan (its warnings printed) -> the build `output/<name>`, for
    the caller to `write()` or, with `check`, compare (`stale()`). `dir_name` turns the plan's
    name into another directory name (a sweep point's).

    Raises SpecError when the spec is invalid: each caller labels the problems its own way.
    Unless `check`, a target that is not an lmspec build is refused (UsageError) before any
    artifact is emitted; `write()` checks again.
    """
    from lmspec.compiler.build.ownership import BUILD, require_replaceable
    from lmspec.compiler.build.writer import build_target

    def build_dir(name: str) -> Path:
        return build_target(output, dir_name(name) if dir_name is not None else name)

    plan = plan_from(compose_spec(list(overrides), spec_file), build_dir)
    if print_warnings:
        print_problems(plan.warnings)
    target = build_dir(plan.name)
    if not check:
        require_replaceable(target, BUILD)
    return Compiled(plan, target)
