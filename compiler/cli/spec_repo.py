"""A spec repository (what `lmspec init` writes): its jobs are the primary specs `specs/*.yaml`,
their own groups live in `specs/<group>/`, their builds in `build/<name>/`.

What marks one is `schemas/spec-file.schema.json` beside `specs/` (`REPOSITORY_MARK`): `init` writes it,
and every job's modeline names it. A `specs/` folder without it (another tool's, or a folder of group
files) is no spec repository: there an override-only call composes lmspec's built-in default spec,
and its `specs/<group>/` folders add options to choose by name (compiler/spec/spec_file.py).

Run from a spec repository without `--spec`, `check`, `compile`, `compile --check` and
`diff --against` act on every job in it, as `hook` does: the built-in default spec means
nothing there, and a drift gate that looked at it would pass while a team spec changed.
"""

from __future__ import annotations

import sys
from pathlib import Path

from lmspec.compiler.errors import EXIT_FAILED, EXIT_OK, SpecError, UsageError, print_problems
from lmspec.compiler.paths import SPECS_DIR

SPECS = Path("specs")
REPOSITORY_MARK = Path("schemas") / "spec-file.schema.json"


def is_spec_repository(root: Path) -> bool:
    """Whether `root` is a spec repository: `specs/` with `lmspec init`'s mark beside it, and not lmspec's
    own checkout (whose specs/ are the built-in groups and presets)."""
    specs = root / SPECS
    return specs.is_dir() and (root / REPOSITORY_MARK).is_file() and specs.resolve() != SPECS_DIR.resolve()


def primary_specs(specs_dir: Path, changed: list[Path]) -> list[Path]:
    """The primary specs to check for these changed files (all of them when a group changed)."""
    every = sorted(specs_dir.glob("*.yaml")) + sorted(specs_dir.glob("*.yml"))
    if not changed:
        return every
    root = specs_dir.resolve()
    changed_primaries = [f for f in changed if f.resolve().parent == root]
    touches_group = any(root in f.resolve().parents and f.resolve().parent != root for f in changed)
    return every if touches_group else sorted(f for f in changed_primaries if f.is_file())


def repo_specs(spec: Path | None, overrides: list[str], command: str) -> list[Path]:
    """The jobs a command acts on when `--spec` is left out in a spec repository; [] when `--spec`
    names one, or outside a spec repository, where the built-in default spec is meant. Overrides
    without `--spec` are refused there, listing the jobs to choose from."""
    if spec is not None or not is_spec_repository(Path(".")):
        return []
    specs = primary_specs(SPECS, [])
    if specs and overrides:
        job = str(specs[0]) if len(specs) == 1 else f"{SPECS}/JOB.yaml"
        raise UsageError(
            f"{command}: overrides change one job, and this is a spec repository ({REPOSITORY_MARK} beside "
            f"{SPECS}/, as lmspec init writes it) of {len(specs)} job(s): {', '.join(str(s) for s in specs)}; "
            f"name the job: lmspec {command} --spec {job} {' '.join(overrides)} "
            f"(without overrides, {command} acts on every job)"
        )
    return specs


def check_specs(specs: list[Path], output: Path, *, compile_check: bool) -> int:
    """Validate every spec (and with `compile_check`, compare its build on disk); every problem
    is printed, exit 1 when any spec fails."""
    results = [_check_one(spec, output, compile_check) for spec in specs]
    return EXIT_OK if all(results) else EXIT_FAILED


def _check_one(spec: Path, output: Path, compile_check: bool) -> bool:
    from lmspec.compiler.pipeline import compile_one

    try:
        compiled = compile_one(spec, [], output, check=True)
    except SpecError as exc:
        print_problems(exc.problems)
        print(f"{spec}: invalid", file=sys.stderr)
        return False
    if not compile_check:
        print(f"{spec}: valid ({len(compiled.plan.warnings)} warnings)")
        return True
    stale = compiled.stale()
    if stale:
        print(
            f"{compiled.target} is stale ({', '.join(stale)}); refresh it: lmspec compile --spec {spec} -o {output}",
            file=sys.stderr,
        )
        return False
    print(f"{compiled.target}: up to date")
    return True


def compile_specs(specs: list[Path], output: Path) -> int:
    """Compile every spec, then write the builds only when all of them are valid and no two share
    a build directory: one broken job leaves every build as it was."""
    from lmspec.compiler.pipeline import Compiled, compile_one

    compiled: dict[Path, Compiled] = {}
    failed = False
    for spec in specs:
        try:
            compiled[spec] = compile_one(spec, [], output, check=False)
        except SpecError as exc:
            print_problems(exc.problems)
            print(f"{spec}: invalid", file=sys.stderr)
            failed = True
    owners: dict[Path, Path] = {}
    for spec, build in compiled.items():
        if (first := owners.setdefault(build.target, spec)) != spec:
            print(f"{first} and {spec} both compile to {build.target}: give one of them another name:", file=sys.stderr)
            failed = True
    if failed:
        print(f"nothing written ({output}/ is as it was): fix the specs above, then compile again", file=sys.stderr)
        return EXIT_FAILED
    for build in compiled.values():
        build.write()
        print(f"compiled {build.target} ({len(build.files)} files, {len(build.plan.warnings)} warnings)")
    return EXIT_OK
