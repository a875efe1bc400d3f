"""`lmspec hook check|compile-check [FILES]`: what pre-commit and CI run in a spec repository.

A spec repository keeps its jobs in `specs/*.yaml` (primary specs whose defaults lists
pull lmspec's built-in groups), its own groups in `specs/<group>/`, and the compiled
builds in `build/<name>/`. pre-commit passes the changed files: a changed primary spec is
checked alone; a changed group file can change any job, so every primary spec is checked.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lmspec.compiler.errors import EXIT_FAILED, EXIT_OK, SpecError, print_problems


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "hook",
        help="pre-commit/CI checks of a spec repository (specs/*.yaml -> build/)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n"
        + "\n".join(
            (
                "  lmspec hook check",
                "  lmspec hook compile-check specs/llama3_8b_pretrain_8gpu_h100_bf16.yaml",
            )
        ),
    )
    p.add_argument(
        "mode",
        choices=("check", "compile-check"),
        help="check: validate specs; compile-check: fail when build/ differs from a fresh compile",
    )
    p.add_argument("files", nargs="*", type=Path, help="changed files (from pre-commit); none = every spec")
    p.add_argument(
        "--specs-dir", type=Path, default=Path("specs"), help="where the primary specs live (default: specs)"
    )
    p.add_argument("-o", "--output", type=Path, default=Path("build"), help="build root (default: build)")
    p.set_defaults(handler=run_hook)


def primary_specs(specs_dir: Path, changed: list[Path]) -> list[Path]:
    """The primary specs to check for these changed files (all of them when a group changed)."""
    every = sorted(specs_dir.glob("*.yaml")) + sorted(specs_dir.glob("*.yml"))
    if not changed:
        return every
    root = specs_dir.resolve()
    changed_primaries = [f for f in changed if f.resolve().parent == root]
    touches_group = any(root in f.resolve().parents and f.resolve().parent != root for f in changed)
    return every if touches_group else sorted(f for f in changed_primaries if f.is_file())


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


def run_hook(args: argparse.Namespace) -> int:
    # The drift gate always checks every build: a hand-edited build/ file is drift too.
    specs = primary_specs(args.specs_dir, list(args.files) if args.mode == "check" else [])
    if not specs and not args.files:
        print(f"{args.specs_dir}/: no spec files (*.yaml) to check", file=sys.stderr)
        return EXIT_FAILED
    results = [_check_one(spec, args.output, args.mode == "compile-check") for spec in specs]
    return EXIT_OK if all(results) else EXIT_FAILED
