"""`lmspec compile -m a=1,2 b=x,y`: Hydra's sweep grammar, one build per combination, and an
index `<build root>/<name>-sweep.md` comparing their key numbers side by side."""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from lmspec.compiler.build.safe_read import Unreadable, read_regular
from lmspec.compiler.errors import EXIT_FAILED, EXIT_OK, SpecError, UsageError, print_problems

if TYPE_CHECKING:
    from lmspec.compiler.pipeline import Compiled

INDEX_HEADER = "# Sweep: "  # the index's first line starts so; an existing file that does not is not replaced


def _swept_keys(overrides: list[str]) -> set[str]:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return {o.key_or_group for o in OverridesParser.create().parse_overrides(overrides) if o.is_sweep_override()}


def sweep_combinations(overrides: list[str]) -> list[tuple[list[str], str]]:
    """Each combination's overrides and a directory suffix naming only the swept values."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    from lmspec.compiler.spec.hydra_compat import split_sweep

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except OverrideParseException as exc:
        from lmspec.compiler.spec.overrides import override_error

        raise override_error(exc) from None
    swept = _swept_keys(overrides)
    combos = []
    for combo in split_sweep(parsed):
        suffix = ",".join(o for o in combo if o.split("=", 1)[0].lstrip("+~") in swept)
        combos.append((combo, suffix))
    return combos


def sweep_point_name(name: str, suffix: str) -> str:
    """The directory name of one sweep point: never a path of its own, whatever the swept values.

    `<name>-<suffix>` when the swept overrides are plain ASCII name characters and fit in one
    directory entry (tiny-parallel.tp=2); otherwise every other character becomes `_` and 8 hex
    digits of the overrides' sha256 follow, the slug cut to fit (`tiny-train.checkpoint.dir=a_b-1f2e3d4c`).
    The sweep index lists each name next to the overrides it stands for.
    """
    from lmspec.compiler.build.atomic import NAME_MAX
    from lmspec.compiler.build.digest import sha256

    if not suffix:
        return name
    plain = f"{name}-{suffix}"
    if _PLAIN_SUFFIX.fullmatch(suffix) and len(plain.encode("utf-8")) <= NAME_MAX:
        return plain
    digest = sha256(suffix)[:8]
    room = NAME_MAX - len(name.encode("utf-8")) - len(digest) - 2
    slug = re.sub(r"[^A-Za-z0-9._=,+-]+", "_", suffix)[: max(room, 0)]
    return f"{name}-{slug}-{digest}" if slug else f"{name}-{digest}"


_PLAIN_SUFFIX = re.compile(r"[A-Za-z0-9._=,+-]+")


def one_line(text: str) -> str:
    """`text` on one line: control characters (a newline in a swept value) written as escapes."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def compile_many(combos: list[tuple[list[str], str]], args: argparse.Namespace) -> int:
    """Compile every combination, then the index comparing them; exit 1 if any is invalid or stale.

    Every build's directory is named by `sweep_point_name`, directly under the build root; all
    targets (and the index) are checked before the first is written, so a refusal writes nothing.
    """
    from lmspec.compiler.build.atomic import write_file_atomic
    from lmspec.compiler.build.files import PLAN
    from lmspec.compiler.build.ownership import require_own_file
    from lmspec.compiler.pipeline import compile_one

    status = EXIT_OK
    points: list[tuple[str, Compiled | None, list[str]]] = []  # suffix, build (None: invalid), problems
    for overrides, suffix in combos:
        try:
            made = compile_one(
                args.spec,
                overrides,
                args.output,
                check=args.check,
                dir_name=partial(sweep_point_name, suffix=suffix),
                print_warnings=False,  # counted in the index instead
            )
        except SpecError as exc:
            print(f"[{one_line(suffix)}] invalid:", file=sys.stderr)
            print_problems(exc.problems)
            points.append((suffix, None, [p.message for p in exc.problems if p.severity == "error"]))
            status = EXIT_FAILED
            continue
        points.append((suffix, made, [p.message for p in made.plan.warnings]))
    by_target: dict[Path, str] = {}
    for suffix, point, _ in points:
        if point is None:
            continue
        if point.target in by_target:
            raise UsageError(
                f"sweep points {one_line(by_target[point.target])!r} and {one_line(suffix)!r} would both be built as "
                f"{point.target}; list each combination once"
            )
        by_target[point.target] = suffix
    index_name = _sweep_name(points, args)
    index_path = args.output / f"{index_name}-sweep.md"
    if not args.check:
        require_own_file(index_path, INDEX_HEADER)
    rows: list[SweepRow] = []
    for suffix, point, problems in points:
        if point is None:
            rows.append(SweepRow(suffix, None, None, problems))
            continue
        rows.append(SweepRow(suffix, point.target.name, point.files[PLAN], problems))
        if args.check:
            stale = point.stale()
            print(f"{point.target}: {'stale: ' + ', '.join(stale) if stale else 'up to date'}")
            status = EXIT_FAILED if stale else status
        else:
            point.write()
            print(f"compiled {point.target} ({len(point.files)} files)")
    swept = [o for o in args.overrides if o.split("=", 1)[0].lstrip("+~") in _swept_keys(args.overrides)]
    index = sweep_index(rows, swept)
    if args.check:
        try:
            fresh = read_regular(index_path) == index.encode("utf-8")
        except Unreadable:
            fresh = False
        print(f"{index_path}: {'up to date' if fresh else 'stale'}")
        return status if fresh else EXIT_FAILED
    write_file_atomic(index_path, index, owned_prefix=INDEX_HEADER)
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


def _sweep_name(points: list[tuple[str, Compiled | None, list[str]]], args: argparse.Namespace) -> str:
    built = [made.plan.name for _, made, _ in points if made is not None]
    if built:
        return built[0]
    return args.spec.stem if args.spec is not None else "sweep"


def sweep_index(rows: list[SweepRow], swept: list[str]) -> str:
    """Markdown: one row per build with the key numbers of its plan.json, invalid ones too."""
    from lmspec.compiler.build.compare import key_numbers

    numbers = [key_numbers(json.loads(r.plan_json)) if r.plan_json else {} for r in rows]
    labels = list(dict.fromkeys(label for n in numbers for label in n))
    valid = [n for n in numbers if n]
    columns = [c for c in labels if c in ALWAYS_SHOWN or len({n.get(c) for n in valid}) > 1]
    lines = [
        f"{INDEX_HEADER}{one_line(' '.join(swept)) or 'one combination'}",
        "",
        f"{sum(r.build is not None for r in rows)} of {len(rows)} combinations valid; "
        "each build's REPORT.md has the details.",
        "",
        "| build | overrides | " + " | ".join(columns) + " | problems |",
        "|---|---|" + "---|" * len(columns) + "---|",
    ]
    for row, values in zip(rows, numbers):
        name = f"[{row.build}](<{row.build}/REPORT.md>)" if row.build else "(invalid)"
        cells = [_cell(row.suffix) or "-"] + [values.get(c, "") for c in columns]
        if row.build is None:
            more = f" (+{len(row.problems) - 1} more)" if len(row.problems) > 1 else ""
            problems = "error: " + _cell(row.problems[0]) + more
        else:
            problems = f"{len(row.problems)} warning(s)" if row.problems else "-"
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {problems} |")
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    """`text` as one Markdown table cell: one line, `|` escaped."""
    return one_line(text).replace("|", "\\|")
