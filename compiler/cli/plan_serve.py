"""`lmspec plan --serve`: rank the serving layouts of the spec's hardware by goodput under its latency targets.

A serve-only spec (train: null) plans its serving without the flag: serving is all it has, and a training
search has nothing to search. A spec that trains and serves plans its training unless --serve is given; its
serving search leaves the training part as it is. The search is compiler/search/serve_*.py; here are the
words around it: the winner is printed as the `lmspec compile` command that builds it (the user's words
less the searched serve keys, then the winner's), and every rule of `lmspec check` runs on that command
before it is printed, so it compiles as printed or its problems are shown beside it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from lmspec.compiler.cli.plan_words import job_overrides, problems_of, shell, spec_words
from lmspec.compiler.errors import EXIT_OK, SpecError, UsageError, error, print_problems
from lmspec.compiler.models.units import GIB
from lmspec.compiler.search import serve_report
from lmspec.compiler.search.serve_search import ServeSearchResult, own_deployment, search_serve
from lmspec.compiler.spec.sections import Spec, serving

# training's flags, each with why a serving plan does not take it
TRAINING_ONLY = {
    "gpus": "--gpus searches training GPU counts; a serving plan fills the spec's hardware: set hardware.nodes=N",
    "backend": "--backend picks training backends; serving runs vLLM",
    "plot": "--plot draws training's memory against tokens/s; a serving plan has no plot",
}
NO_SERVE_FIX = "set a serving part: drop serve=null, or add serve=default with serve.model_path=DIR (what vLLM serves)"


def _refuse_training_flags(args: argparse.Namespace) -> None:
    for flag, why in TRAINING_ONLY.items():
        if getattr(args, flag):
            raise UsageError(f"{why} (lmspec plan --serve)")
    if args.objective == "min-gpus":
        raise UsageError(
            "--objective min-gpus is training's; a serving plan ranks by goodput (throughput) or goodput per GPU "
            "(cost), on the spec's hardware (hardware.nodes)"
        )


def _no_fit(result: ServeSearchResult) -> SpecError:
    spec = result.spec
    where = f"{result.budget_gpus} x {spec.hardware.gpu.name}"
    if not result.legal:
        rules = ", ".join(f"{rule} ({n:,})" for rule, n in serve_report.rejection_lines(result))
        return SpecError(
            [
                error(
                    "serve",
                    f"no serving layout of {spec.model.name} on {where} passes lmspec's rules ({rules}); "
                    "run lmspec check on the spec for each rule's message and fix",
                )
            ]
        )
    more = f"hardware.nodes={spec.hardware.nodes * 2}" if spec.train is None else "serve=null"
    return SpecError(
        [
            error(
                "serve.max_model_len",
                f"no serving layout of {spec.model.name} fits on {where}: {result.legal:,} legal layouts all leave "
                f"less KV cache than one serve.max_model_len={spec.serve.max_model_len} sequence (the most any holds: "
                f"{result.longest_fit:,} tokens); use serve.max_model_len<={result.longest_fit} where that is "
                f"long enough, serve.kv_cache_dtype=fp8, serve.quantization=fp8, or {more}",
            )
        ]
    )


def _write(args: argparse.Namespace, job: list[str], result: ServeSearchResult) -> Path:
    from lmspec.compiler.paths import display_path
    from lmspec.compiler.search.write import spec_file_text

    best = result.ranked[0]
    flags = ["--serve", "--objective", args.objective]
    command = "lmspec plan " + shell([*spec_words(args), *args.overrides, *flags])
    header = (
        f"# {result.spec.model.name} serving on {best.candidate.gpus} x {result.spec.hardware.gpu.name}, chosen by "
        f"`lmspec plan --serve` (objective {result.objective}): {serve_report.layout_text(best)}, "
        f"{best.candidate.replicas} replica(s);\n"
        f"# estimated {best.perf.goodput_rps:,.2f} goodput requests/s, TPOT {best.perf.tpot_s * 1e3:,.1f} ms, "
        f"{best.memory.cache_budget_bytes / GIB:.1f} GiB of KV cache per GPU.\n"
        + f"#   {command}\n"
        + f"#   lmspec compile --spec {display_path(args.write)}\n"
    )
    args.write.write_text(spec_file_text(args.write, job, args.spec, header), encoding="utf-8")
    return args.write


def plan_serve(args: argparse.Namespace, spec: Spec, composed: Any) -> int:
    """Search, rank and print the serving layouts of `spec` (composed with `args`)."""
    served = serving(spec)
    if served is None:
        raise UsageError(
            f"lmspec plan --serve searches serving layouts, but this spec does not serve (serve: null); {NO_SERVE_FIX}"
        )
    _refuse_training_flags(args)
    result = search_serve(served, composed.origins, args.objective)
    if not result.ranked:
        if args.format == "json":
            print(json.dumps(serve_report.to_json(result, args.top, {"winner_command": None}), indent=2))
        raise _no_fit(result)
    job = job_overrides(args, result.ranked[0].candidate.overrides(served))
    problems, failed = problems_of(job, args.spec)
    if failed and args.write is not None:
        raise SpecError(problems)
    line = "lmspec compile " + shell([*spec_words(args), *job])
    written = _write(args, job, result) if args.write is not None else None
    own = serve_report.own_line(result, own_deployment(served, composed.origins))
    if args.format == "json":
        extra = {
            "winner_command": line,
            "winner_problems": [p.line() for p in problems],
            "current_layout": own,
            "written": str(written) if written else None,
        }
        print(json.dumps(serve_report.to_json(result, args.top, extra), indent=2))
        return EXIT_OK
    serve_report.print_table(result, args.top)
    print(own)
    print_problems(problems)
    print(f"winner: {line}")
    if written is not None:
        print(f"wrote {written}: lmspec compile --spec {written}")
    return EXIT_OK
