"""`lmspec compile -m a=1,2 b=x,y`: Hydra's sweep grammar, one build per combination, and an
index `<build root>/<name>-sweep.md` comparing their key numbers side by side."""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from compiler.errors import SpecError, UsageError


def _swept_keys(overrides: list[str]) -> set[str]:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return {o.key_or_group for o in OverridesParser.create().parse_overrides(overrides) if o.is_sweep_override()}


def sweep_combinations(overrides: list[str]) -> list[tuple[list[str], str]]:
    """Each combination's overrides and a directory suffix naming only the swept values."""
    # Imported here: `lmspec compile` without -m loads this module too, and pays nothing for it.
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except OverrideParseException as exc:
        from compiler.load import override_error

        raise override_error(exc) from None
    swept = _swept_keys(overrides)
    combos = []
    for batch in BasicSweeper.split_arguments(parsed, max_batch_size=None):
        for combo in batch:
            suffix = ",".join(o for o in combo if o.split("=", 1)[0].lstrip("+~") in swept)
            combos.append((list(combo), suffix))
    return combos


def compile_many(combos: list[tuple[list[str], str]], args: argparse.Namespace) -> int:
    """Compile every combination, then the index comparing them; exit 1 if any is invalid or stale."""
    from compiler.cli import EXIT_INVALID, EXIT_OK, _print_problems
    from compiler.pipeline import make_plan
    from compiler.writer import build_files, stale_files, write_build

    status = EXIT_OK
    rows: list[SweepRow] = []
    for overrides, suffix in combos:
        try:
            plan = make_plan(overrides, args.spec)
        except SpecError as exc:
            print(f"[{suffix}] invalid:", file=sys.stderr)
            _print_problems(exc.problems)
            rows.append(SweepRow(suffix, None, None, [p.message for p in exc.problems if p.severity == "error"]))
            status = EXIT_INVALID
            continue
        target = args.output / f"{plan.name}-{suffix}" if suffix else args.output / plan.name
        files = build_files(plan, replacing=target)
        rows.append(SweepRow(suffix, target.name, files["plan.json"], [p.message for p in plan.warnings]))
        if args.check:
            stale = stale_files(target, files)
            print(f"{target}: {'stale: ' + ', '.join(stale) if stale else 'up to date'}")
            status = EXIT_INVALID if stale else status
        else:
            write_build(target, files)
            print(f"compiled {target} ({len(files)} files)")
    index_path = args.output / f"{_sweep_name(rows, args)}-sweep.md"
    swept = [o for o in args.overrides if o.split("=", 1)[0].lstrip("+~") in _swept_keys(args.overrides)]
    index = sweep_index(rows, swept)
    if args.check:
        fresh = index_path.is_file() and index_path.read_text(encoding="utf-8") == index
        print(f"{index_path}: {'up to date' if fresh else 'stale'}")
        return status if fresh else EXIT_INVALID
    _write_atomic(index_path, index)
    print(f"index {index_path}")
    sys.stdout.write(index)
    return status


ALWAYS_SHOWN = ("world size", "tp x pp x dp x ep", "memory/GPU", "fits")


@dataclass(frozen=True)
class SweepRow:
    suffix: str
    build: str | None  # directory name under the build root; None when the spec was invalid
    plan_json: str | None
    problems: list[str]  # warnings of a valid build, errors of an invalid one


def _sweep_name(rows: list[SweepRow], args: argparse.Namespace) -> str:
    built = [r.build[: -len(r.suffix) - 1] for r in rows if r.build and r.suffix]
    if built:
        return built[0]
    return args.spec.stem if args.spec is not None else "sweep"


def sweep_index(rows: list[SweepRow], swept: list[str]) -> str:
    """Markdown: one row per build with the key numbers of its plan.json, invalid ones too."""
    from compiler.build_compare import key_numbers

    numbers = [key_numbers(json.loads(r.plan_json)) if r.plan_json else {} for r in rows]
    labels = list(dict.fromkeys(label for n in numbers for label in n))
    valid = [n for n in numbers if n]
    columns = [c for c in labels if c in ALWAYS_SHOWN or len({n.get(c) for n in valid}) > 1]
    lines = [
        f"# Sweep: {' '.join(swept) or 'one combination'}",
        "",
        f"{sum(r.build is not None for r in rows)} of {len(rows)} combinations valid; "
        "each build's REPORT.md has the details.",
        "",
        "| build | " + " | ".join(columns) + " | problems |",
        "|---|" + "---|" * len(columns) + "---|",
    ]
    for row, values in zip(rows, numbers):
        name = f"[{row.build}](<{row.build}/REPORT.md>)" if row.build else f"{row.suffix} (invalid)"
        cells = [values.get(c, "") for c in columns]
        if row.build is None:
            more = f" (+{len(row.problems) - 1} more)" if len(row.problems) > 1 else ""
            problems = "error: " + row.problems[0].replace("|", "\\|") + more
        else:
            problems = f"{len(row.problems)} warning(s)" if row.problems else "-"
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {problems} |")
    return "\n".join(lines) + "\n"


def _write_atomic(path: Path, text: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        staging = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        staging.write_text(text, encoding="utf-8")
        os.replace(staging, path)
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror}") from None
