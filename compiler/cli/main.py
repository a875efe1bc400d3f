"""The `lmspec` command line. Exit codes: 0 ok, 1 spec invalid, 2 usage or I/O error.

User mistakes print one line per problem and no traceback (LMSPEC_DEBUG=1 shows it).
"""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from lmspec.compiler.errors import Problem, SpecError, UsageError

EXIT_OK, EXIT_INVALID, EXIT_USAGE = 0, 1, 2
# A compile builds ~50k long-lived objects (modules, Hydra's configs) and almost no cycles; at
# CPython's default threshold (700) the collector rescans them a dozen times, and once more
# at exit: a quarter of a compile's CPU (bench/compile_speed.py). The console command
# collects rarely and freezes what is alive before exiting.
_GC_GEN0_THRESHOLD = 100_000

# Modules adding the subcommand they are named after (compiler.<command>_command): each has
# `register(subparsers)` and imports nothing heavy at module level (torch, deepspeed, megatron,
# vllm load inside the handler, if at all).
COMMAND_MODULES: tuple[str, ...] = (
    "lmspec.compiler.cli.logs",
    "lmspec.compiler.cli.doctor",
    "lmspec.compiler.cli.run",
    "lmspec.compiler.cli.init",
    "lmspec.compiler.cli.diff",
    "lmspec.compiler.cli.hook",
    "lmspec.compiler.cli.plan",
)


def _print_problems(problems: Sequence[Problem]) -> None:
    for problem in problems:
        print(problem.line(), file=sys.stderr)


def _spec_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--spec",
        type=Path,
        default=None,
        help="a spec file of your own (its defaults list may pull lmspec's built-in groups), or a built-in preset name",
    )
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="OVERRIDE",
        help="Hydra overrides: key=value, group=option, +new.key=value, ~key",
    )


def _cmd_compile(args: argparse.Namespace) -> int:
    from lmspec.compiler.build.writer import (
        BUILD,
        build_files,
        build_target,
        require_replaceable,
        stale_files,
        write_build,
    )
    from lmspec.compiler.pipeline import make_plan

    if args.multirun:
        from lmspec.compiler.cli.sweep import compile_many, sweep_combinations

        return compile_many(sweep_combinations(args.overrides), args)
    plan = make_plan(list(args.overrides), args.spec)
    _print_problems(plan.warnings)
    target = build_target(args.output, plan.name)
    if not args.check:
        require_replaceable(target, BUILD)  # refused before any work; write_build checks again
    files = build_files(plan, replacing=target)
    if args.check:
        differences = stale_files(target, files)
        if differences:
            print(f"{target} is stale; recompile and commit it:", file=sys.stderr)
            for line in differences:
                print(f"  {line}", file=sys.stderr)
            return EXIT_INVALID
        print(f"{target} is up to date ({len(files)} files)")
        return EXIT_OK
    write_build(target, files)
    print(f"compiled {target} ({len(files)} files, {len(plan.warnings)} warnings)")
    return EXIT_OK


def _cmd_check(args: argparse.Namespace) -> int:
    from lmspec.compiler.pipeline import make_plan

    plan = make_plan(list(args.overrides), args.spec)
    _print_problems(plan.warnings)
    print(
        f"{plan.name}: valid ({plan.layout.world_size} ranks: tp {plan.layout.tp} x pp {plan.layout.pp} "
        f"x dp {plan.layout.dp} x cp {plan.layout.cp}; {len(plan.warnings)} warnings)"
    )
    return EXIT_OK


def _cmd_explain(args: argparse.Namespace) -> int:
    from lmspec.compiler.cli.explain import explain_json, explain_text
    from lmspec.compiler.plan import build_plan
    from lmspec.compiler.spec.load import compose_spec
    from lmspec.compiler.spec.validate import validate

    composed = compose_spec(list(args.overrides), args.spec)
    spec, warnings = validate(composed)
    plan = build_plan(spec, composed, warnings)
    if args.format == "json":
        print(explain_json(plan, composed.origins))
    else:
        _print_problems(plan.warnings)
        print(explain_text(plan, composed.origins))
    return EXIT_OK


def _cmd_schema(args: argparse.Namespace) -> int:
    from lmspec.compiler.spec.schema import spec_schema_text

    sys.stdout.write(spec_schema_text())
    return EXIT_OK


BUILTIN_COMMANDS = ("compile", "check", "explain", "schema")


def _command_modules(argv: Sequence[str]) -> tuple[str, ...]:
    """The module of the command being run, none for a built-in one, all for help or a typo.

    Importing and registering every command module cost ~5 ms of a ~0.25 s compile, paid
    by each pre-commit run.
    """
    command = next((word for word in argv if not word.startswith("-")), None)
    if command in BUILTIN_COMMANDS:
        return ()
    module = f"lmspec.compiler.cli.{command}"
    return (module,) if module in COMMAND_MODULES else COMMAND_MODULES


def build_parser(modules: Sequence[str] = COMMAND_MODULES) -> argparse.ArgumentParser:
    from lmspec.compiler import __version__

    parser = argparse.ArgumentParser(
        prog="lmspec",
        description=(
            "Check a large-model job spec and compile it into reviewed launch, conversion and serving artifacts."
        ),
    )
    parser.add_argument("--version", action="version", version=f"lmspec {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("compile", help="validate and write build/<name>/")
    _spec_args(p)
    p.add_argument("-o", "--output", type=Path, default=Path("build"), help="build root (default: build)")
    p.add_argument("--check", action="store_true", help="do not write; exit 1 if the build on disk is stale")
    p.add_argument("-m", "--multirun", action="store_true", help="Hydra sweep: one build per combination (a=1,2)")
    p.set_defaults(handler=_cmd_compile)

    p = sub.add_parser("check", help="validate only: every problem at once")
    _spec_args(p)
    p.set_defaults(handler=_cmd_check)

    p = sub.add_parser("explain", help="the resolved spec with where each value came from, and derived numbers")
    _spec_args(p)
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.set_defaults(handler=_cmd_explain)

    p = sub.add_parser("schema", help="print the spec's JSON Schema")
    p.set_defaults(handler=_cmd_schema)

    for module in modules:
        importlib.import_module(module).register(sub)
    return parser


def run(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(_command_modules(argv)).parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return handler(args)
    except SpecError as exc:
        if os.environ.get("LMSPEC_DEBUG") == "1":
            raise
        _print_problems(exc.problems)
        errors = sum(p.severity == "error" for p in exc.problems)
        print(f"lmspec: spec invalid: {errors} error(s), {len(exc.problems) - errors} warning(s)", file=sys.stderr)
        return EXIT_INVALID
    except UsageError as exc:
        if os.environ.get("LMSPEC_DEBUG") == "1":
            raise
        print(f"lmspec: error: {exc}", file=sys.stderr)
        return EXIT_USAGE


def main() -> None:
    gc.set_threshold(_GC_GEN0_THRESHOLD)
    try:
        code = run()
        sys.stdout.flush()
    except BrokenPipeError:  # `lmspec explain | head`: the reader left; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = EXIT_OK
    gc.freeze()
    sys.exit(code)
