"""`lmspec compile`: validate a spec and write its build, or with --check say whether the build
on disk is what a compile would write (the CI drift gate). `-m` sweeps (compiler/cli/sweep.py)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lmspec.compiler.cli.help_text import described
from lmspec.compiler.cli.spec_args import add_spec_args
from lmspec.compiler.cli.spec_repo import check_specs, compile_specs, repo_specs
from lmspec.compiler.errors import EXIT_FAILED, EXIT_OK


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "compile",
        help="validate and write build/<name>/",
        **described(
            "Check the spec as `lmspec check` does, then write its reviewed artifacts to build/<name>/: "
            "plan.json, REPORT.md, the ds_config or Megatron arguments, torchrun and Slurm scripts, NCCL "
            "env, conversion mappings and vLLM serve args. An earlier lmspec build there is replaced whole; "
            "--check writes nothing and exits 1 when the build on disk is stale (for CI). In a spec repository "
            "(lmspec init) without --spec, every spec in specs/ is compiled or checked.",
            "lmspec compile",
            "lmspec compile --spec specs/llama3_8b_pretrain_8gpu_h100_bf16.yaml",
            "lmspec compile model=tiny parallel.tp=2 -o build",
            "lmspec compile --check --spec specs/llama3_8b_pretrain_8gpu_h100_bf16.yaml",
        ),
    )
    add_spec_args(p)
    p.add_argument("-o", "--output", type=Path, default=Path("build"), help="build root (default: build)")
    p.add_argument("--check", action="store_true", help="do not write; exit 1 if the build on disk is stale")
    p.add_argument("-m", "--multirun", action="store_true", help="Hydra sweep: one build per combination (a=1,2)")
    p.set_defaults(handler=_cmd_compile)


def _cmd_compile(args: argparse.Namespace) -> int:
    if specs := repo_specs(args.spec, list(args.overrides), "compile"):
        if args.check:
            return check_specs(specs, args.output, compile_check=True)
        return compile_specs(specs, args.output)
    if args.multirun:
        from lmspec.compiler.cli.sweep import compile_many, sweep_combinations

        return compile_many(sweep_combinations(args.overrides), args)
    from lmspec.compiler.pipeline import compile_one

    compiled = compile_one(args.spec, args.overrides, args.output, check=args.check)
    if args.check:
        differences = compiled.stale()
        if differences:
            print(f"{compiled.target} is stale; recompile and commit it:", file=sys.stderr)
            for line in differences:
                print(f"  {line}", file=sys.stderr)
            return EXIT_FAILED
        print(f"{compiled.target} is up to date ({len(compiled.files)} files)")
        return EXIT_OK
    compiled.write()
    print(f"compiled {compiled.target} ({len(compiled.files)} files, {len(compiled.plan.warnings)} warnings)")
    print(f"run it: lmspec run {compiled.target} (--dry-run: show what would start)")
    return EXIT_OK
