"""`lmspec plan`: search every legal layout of a job and print the best, as `lmspec check` composes it.

The winner is printed as the `lmspec compile` command that builds it, and that command compiles as printed:
the search mirrors every training rule (compiler/search/legality.py), and every other rule is run on the
winner before it is shown. The one part of a job plan does not search is its serving part. When the job
never set it (every serve key is lmspec's built-in serve group: `lmspec plan model=deepseek_v3
hardware=h800_80g`, whose default engine is one node of 8 GPUs) and it does not compile, the command
carries `serve=null`: the user asked for a training layout, and a serving engine they never sized is no
reason to print a command that fails; a line says what was dropped and how to serve too. A serving part the
job did set (its spec file or its overrides) is kept as it is and its errors are shown: plan does not
rewrite what the user asked for, and those errors are the spec's own, whatever the training layout.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

from lmspec.compiler.backends import BACKENDS
from lmspec.compiler.cli.help_text import described
from lmspec.compiler.cli.plan_words import job_overrides, problems_of, shell, spec_words
from lmspec.compiler.errors import EXIT_OK
from lmspec.compiler.spec.kinds import NODES_MAX

GPUS = re.compile(r"([0-9]+)(?:\.\.([0-9]+))?")  # matched whole (fullmatch), ASCII digits


def parse_gpus(text: str, per_node: int) -> list[int]:
    """`2048`, `512..4096` or `256,512,1024` -> node counts (whole nodes of the hardware preset)."""
    from lmspec.compiler.errors import UsageError

    nodes: set[int] = set()
    for part in text.split(","):
        match = GPUS.fullmatch(part.strip())
        if not match:
            raise UsageError(f"--gpus {text}: expected N, LOW..HIGH or a comma list of those")
        low, high = int(match[1]), int(match[2] or match[1])
        if low < 1 or high < low:
            raise UsageError(f"--gpus {text}: {part} is empty")
        if match[2] is None and low % per_node:
            raise UsageError(
                f"--gpus {low} is not whole nodes of hardware.gpus_per_node={per_node}; "
                f"use {low // per_node * per_node or per_node} or {(low // per_node + 1) * per_node}"
            )
        if high // per_node > NODES_MAX:
            raise UsageError(
                f"--gpus {text}: at most {NODES_MAX * per_node} GPUs ({NODES_MAX} nodes, hardware.nodes' maximum)"
            )
        found = [n for n in range(-(-low // per_node), high // per_node + 1) if n >= 1]
        if not found:
            raise UsageError(
                f"--gpus {text}: {part} holds no whole node of hardware.gpus_per_node={per_node}; "
                f"use multiples of {per_node}"
            )
        nodes.update(found)
    return sorted(nodes)


def _typed_spec(args: argparse.Namespace) -> tuple[Any, Any]:
    """The composed spec, typed; only the schema is checked (the search checks the rules)."""
    from lmspec.compiler.errors import SpecError
    from lmspec.compiler.spec.load import compose_spec
    from lmspec.compiler.spec.schema_check import schema_problems
    from lmspec.compiler.spec.sections import Spec
    from lmspec.compiler.spec.typed import from_dict

    composed = compose_spec(list(args.overrides), args.spec)
    problems = schema_problems(composed.spec, composed.origins)
    if problems:
        raise SpecError(problems)
    return from_dict(Spec, composed.spec), composed


def _trains(typed: Any) -> Any:
    """The spec as a TrainingSpec, or the usage error of a spec that does not train."""
    from lmspec.compiler.errors import UsageError
    from lmspec.compiler.spec.sections import training

    spec = training(typed)
    if spec is None:
        raise UsageError(
            "lmspec plan searches training layouts, and this spec does not train (train or parallel is null); "
            "lmspec plan --serve searches a spec's serving layouts"
        )
    return spec


def _base_spec(args: argparse.Namespace) -> tuple[Any, Any]:
    """The composed spec as a TrainingSpec; only the schema is checked (the search checks the rules)."""
    typed, composed = _typed_spec(args)
    return _trains(typed), composed


def _nodes(args: argparse.Namespace, spec: Any, composed: Any) -> list[int]:
    from lmspec.compiler.errors import UsageError
    from lmspec.compiler.spec.provenance import COMMAND_LINE

    if args.gpus is None:
        return [spec.hardware.nodes]
    if composed.origins.of("hardware.nodes") == COMMAND_LINE:
        raise UsageError("give either hardware.nodes=N or --gpus, not both")
    return parse_gpus(args.gpus, spec.hardware.gpus_per_node)


def _no_fit(result: Any, args: argparse.Namespace) -> int:
    from lmspec.compiler.errors import SpecError, error
    from lmspec.compiler.models.dims import world_size
    from lmspec.compiler.search.report import gib_number
    from lmspec.compiler.search.search import fewest_gpus

    spec = result.spec
    p = result.priced
    largest = max(result.axes.nodes)
    smallest = f"; the smallest needs {gib_number(p.memory_bytes.min())} GiB" if p.columns.size else ""
    fallback = fewest_gpus(spec, largest, args.backend)
    counts = sorted(world_size(spec.hardware.gpus_per_node, int(n)) for n in result.axes.nodes)
    shown = str(counts[0]) if len(counts) == 1 else f"{counts[0]}..{counts[-1]}"
    where = f"{shown} x {spec.hardware.gpu.name}"
    if fallback is None:
        fewest = "no layout fits on up to the largest GPU count searched; use GPUs with more memory"
        found = None
    else:
        i = int(fallback.ranked[0])
        found = int(fallback.priced.feasible.world[i])
        from lmspec.compiler.search.report import rows

        best = rows(fallback, 1)[0]
        nodes = found // spec.hardware.gpus_per_node
        kept = [o for o in args.overrides if not o.startswith("hardware.nodes=")]
        again = shell(["lmspec", "plan", *spec_words(args), *kept, f"hardware.nodes={nodes}"])
        fewest = (
            f"training fits from {found} GPUs ({nodes} nodes) on, e.g. {best.layout_text()} "
            f"{best.sharding_text()} at {gib_number(best.memory_bytes)} GiB per GPU: {again}"
        )
    message = (
        f"no layout of {spec.model.name} fits on {where}: {result.legal:,} legal layouts all exceed the "
        f"{gib_number(p.budget_bytes)} GiB usable per GPU{smallest}; {fewest}"
    )
    if args.format == "json":
        from lmspec.compiler.search.report import to_json

        print(json.dumps(to_json(result, args.top, {"fewest_gpus": found, "message": message}), indent=2))
    raise SpecError([error("hardware.nodes", message)])


def _cmd_plan(args: argparse.Namespace) -> int:
    from lmspec.compiler.errors import UsageError, print_problems
    from lmspec.compiler.search.report import overrides, print_table, rows, to_json
    from lmspec.compiler.search.search import search

    if args.top < 1:
        raise UsageError(f"--top {args.top}: must be 1 or more")
    from lmspec.compiler.spec.sections import serving, training

    typed, composed = _typed_spec(args)
    if args.serve or (training(typed) is None and serving(typed) is not None):  # a serve-only spec plans serving
        from lmspec.compiler.cli.plan_serve import plan_serve

        return plan_serve(args, typed, composed)
    spec = _trains(typed)
    args.backend = args.backend or list(BACKENDS)
    result = search(spec, _nodes(args, spec, composed), args.backend, args.objective, args.top)
    if not result.feasible:
        return _no_fit(result, args)
    winner = overrides(rows(result, 1)[0].values)
    job, problems, notes = _winner_job(args, composed, winner)
    line = "lmspec compile " + shell([*spec_words(args), *job])
    written = _write(args, job, result) if args.write is not None else None
    if args.plot is not None:
        from lmspec.compiler.search.plot import draw

        draw(args.plot, result)
    if args.format == "json":
        extra = {
            "winner_command": line,
            "winner_problems": [p.line() for p in problems],
            "winner_notes": notes,
            "written": str(written) if written else None,
        }
        print(json.dumps(to_json(result, args.top, extra), indent=2))
        return EXIT_OK
    print_table(result, args.top)
    print_problems(problems)
    for note in notes:
        print(f"note: {note}")
    print(f"winner: {line}")
    if written is not None:
        print(f"wrote {written}: lmspec compile --spec {written}")
    if args.plot is not None:
        print(f"plot: {args.plot}")
    return EXIT_OK


def serving_is_builtin_default(composed: Any) -> bool:
    """Whether the job never set its serving part: it has one, and every serve key comes from lmspec's
    built-in serve group (no serve key in the user's spec file or overrides)."""
    from lmspec.compiler.paths import BUILTIN_PREFIX

    group = f"{BUILTIN_PREFIX}specs/serve/"
    keys = [k for k in composed.origins.where if k == "serve" or k.startswith("serve.")]
    return composed.spec.get("serve") is not None and all(composed.origins.where[k].startswith(group) for k in keys)


def _winner_job(args: argparse.Namespace, composed: Any, winner: list[str]) -> tuple[list[str], list[Any], list[str]]:
    """The overrides of the printed command, the problems `lmspec check` finds in it and notes on what plan
    added. Every rule of `lmspec check` runs on the winner (the search covers the layout's, this the rest); a
    serving part the job never set that does not compile is dropped (`serve=null`, the module's docstring)."""
    from lmspec.compiler.errors import SpecError

    job = job_overrides(args, winner)
    problems, failed = problems_of(job, args.spec)
    if failed and serving_is_builtin_default(composed):
        train_only = [*job, "serve=null"]
        kept, still_failed = problems_of(train_only, args.spec)
        if not still_failed:
            dropped = [p for p in problems if p.severity == "error"]
            note = (
                "serve=null added: the job's serving part is lmspec's default serve group, which the job never "
                f"set, and it does not compile here ({len(dropped)} error(s), first: {dropped[0].message}); "
                "lmspec plan plans training: to serve this model too, set serve.* in your spec as that error "
                "says, or serve from a spec of its own"
            )
            return train_only, kept, [note]
    if failed and args.write is not None:
        raise SpecError(problems)
    return job, problems, []


def _write(args: argparse.Namespace, job: list[str], result: Any) -> Path:
    from lmspec.compiler.models.units import GIB
    from lmspec.compiler.paths import display_path
    from lmspec.compiler.search.report import rows
    from lmspec.compiler.search.write import spec_file_text

    best = rows(result, 1)[0]
    flags = [*(["--gpus", args.gpus] if args.gpus else []), "--objective", args.objective]
    command = "lmspec plan " + shell([*spec_words(args), *args.overrides, *flags])
    header = (
        f"# {result.spec.model.name} on {best.values['gpus']} x {result.spec.hardware.gpu.name}, chosen by "
        f"`lmspec plan` (objective {result.objective}): {best.layout_text()}, {best.sharding_text()}, "
        f"micro batch {best.values['train.micro_batch_size']}, recompute {best.values['train.recompute']};\n"
        f"# estimated {best.step_time_s:.3g} s/step, {best.tokens_per_s:,.0f} tokens/s, MFU {best.mfu:.1%}, "
        f"{best.memory_bytes / GIB:.1f} GiB per GPU.\n"
        + f"#   {command}\n"
        + f"#   lmspec compile --spec {display_path(args.write)}\n"
    )
    text = spec_file_text(args.write, job, args.spec, header)
    args.write.write_text(text, encoding="utf-8")
    return args.write


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "plan",
        help="search every legal layout and rank those that fit (no GPU needed)",
        **described(
            "Search every layout lmspec's rules accept for the spec's model and hardware (TP, PP, DP, CP, EP, "
            "backend, ZeRO or distributed optimizer, micro batch, recompute), keep those whose memory fits, "
            "and rank them by the step-time model; the winner is printed as the `lmspec compile` command "
            "that builds it.",
            "lmspec plan model=llama3_8b hardware=h100_80g --gpus 64",
            "lmspec plan --spec specs/llama3_70b_pretrain_64gpu_h100_bf16.yaml --top 5",
            "lmspec plan model=llama3_70b hardware=h100_80g --gpus 64..256 --objective cost",
            "lmspec plan --spec deepseek_v3_serve_16gpu_h100_fp8 serve.slo.ttft_ms=2000 serve.slo.tpot_ms=100",
        ),
    )
    p.add_argument("--spec", type=Path, default=None, help="a spec file of your own, or a built-in preset name")
    p.add_argument(
        "overrides",
        nargs="*",
        metavar="OVERRIDE",
        help="Hydra overrides of the job, e.g. model=deepseek_v3 hardware=h800_80g train.seq_length=4096",
    )
    p.add_argument(
        "--gpus",
        default=None,
        metavar="N|LOW..HIGH",
        help="GPU counts to search (whole nodes), e.g. 2048 or 512..4096; default: hardware.nodes",
    )
    p.add_argument("--top", type=int, default=10, help="rows to show (default 10)")
    p.add_argument(
        "--serve",
        action="store_true",
        help="search serving layouts (serve.tp/pp/dp/expert_parallel, replicas) on the spec's hardware, ranked "
        "by goodput under serve.slo; the default for a serve-only spec (train: null)",
    )
    p.add_argument(
        "--objective",
        choices=("throughput", "cost", "min-gpus"),
        default="throughput",
        help="throughput: most tokens/s (--serve: most goodput); cost: fewest GPU-seconds per token (--serve: "
        "most goodput per GPU); min-gpus: fewest GPUs (training only)",
    )
    p.add_argument(
        "--backend",
        choices=tuple(BACKENDS),
        action="append",
        default=None,
        help="search this backend only (repeatable; default: every backend)",
    )
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.add_argument(
        "--plot",
        type=Path,
        default=None,
        metavar="FILE.svg|FILE.png",
        help="Pareto plot: memory per GPU against tokens/s of the layouts that fit",
    )
    p.add_argument(
        "--write",
        type=Path,
        default=None,
        metavar="specs/experiment/NAME.yaml",
        help="write the winner as a spec file that `lmspec compile --spec` accepts unchanged",
    )
    p.set_defaults(handler=_cmd_plan)
