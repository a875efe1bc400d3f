"""`lmspec compile -m a=1,2 b=x,y`: Hydra's sweep grammar, one build per combination."""

from __future__ import annotations

import argparse
import sys

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import OverrideParseException

from compiler.errors import SpecError, UsageError


def sweep_combinations(overrides: list[str]) -> list[tuple[list[str], str]]:
    """Each combination's overrides and a directory suffix naming only the swept values."""
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except OverrideParseException as exc:
        raise UsageError(f"cannot parse override: {exc}") from None
    swept = {o.key_or_group for o in parsed if o.is_sweep_override()}
    combos = []
    for batch in BasicSweeper.split_arguments(parsed, max_batch_size=None):
        for combo in batch:
            suffix = ",".join(o for o in combo if o.split("=", 1)[0].lstrip("+~") in swept)
            combos.append((list(combo), suffix))
    return combos


def compile_many(combos: list[tuple[list[str], str]], args: argparse.Namespace) -> int:
    """Compile every combination; report each; exit 1 if any is invalid or stale."""
    from compiler.cli import EXIT_INVALID, EXIT_OK, _print_problems
    from compiler.pipeline import make_plan
    from compiler.writer import build_files, stale_files, write_build

    status = EXIT_OK
    for overrides, suffix in combos:
        try:
            plan = make_plan(overrides, args.spec)
        except SpecError as exc:
            print(f"[{suffix}] invalid:", file=sys.stderr)
            _print_problems(exc.problems)
            status = EXIT_INVALID
            continue
        files = build_files(plan)
        target = args.output / f"{plan.name}-{suffix}" if suffix else args.output / plan.name
        if args.check:
            stale = stale_files(target, files)
            print(f"{target}: {'stale: ' + ', '.join(stale) if stale else 'up to date'}")
            status = EXIT_INVALID if stale else status
        else:
            write_build(target, files)
            print(f"compiled {target} ({len(files)} files)")
    return status
