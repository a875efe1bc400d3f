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

from lmspec.compiler.cli.spec_repo import check_specs, primary_specs
from lmspec.compiler.errors import EXIT_FAILED


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


def run_hook(args: argparse.Namespace) -> int:
    # The drift gate always checks every build: a hand-edited build/ file is drift too.
    specs = primary_specs(args.specs_dir, list(args.files) if args.mode == "check" else [])
    if not specs and not args.files:
        print(f"{args.specs_dir}/: no spec files (*.yaml) to check", file=sys.stderr)
        return EXIT_FAILED
    return check_specs(specs, args.output, compile_check=args.mode == "compile-check")
