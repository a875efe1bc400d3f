"""`lmspec logs`: throughput, MFU/HFU and peak memory of a training run, read from its log."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmspec.compiler.cli.help_text import described
from lmspec.compiler.errors import EXIT_OK

if TYPE_CHECKING:
    from lmspec.compiler.observe.logs.context import RunContext


def add_job_args(parser: argparse.ArgumentParser) -> None:
    """The job a log belongs to: a compiled build, or flags resolved through the spec tree."""
    parser.add_argument(
        "--build",
        type=Path,
        default=None,
        metavar="DIR",
        help="compiled build of the run (its spec.resolved.yaml and plan.json)",
    )
    parser.add_argument("--spec", type=Path, default=None, help="a spec file of your own instead of --build")
    parser.add_argument("--model", default=None, help="model preset (specs/model), e.g. llama3_8b")
    parser.add_argument("--hardware", default=None, help="hardware preset (specs/hardware), e.g. h100_80g")
    parser.add_argument("--gpus", type=int, default=None, help="GPUs in the job (whole nodes of the preset)")
    parser.add_argument("--seq-length", type=int, default=None, help="training sequence length in tokens")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a further Hydra override of the job (repeatable), e.g. train.global_batch_size=512",
    )


def job_context(args: argparse.Namespace) -> RunContext | None:
    """RunContext from --build, or from flags/overrides, or None when none is given."""
    from lmspec.compiler.errors import UsageError
    from lmspec.compiler.observe.logs.context import load_build, load_flags

    flags = (args.spec, args.model, args.hardware, args.gpus, args.seq_length)
    if args.seq_length is not None and all(f is None for f in flags[:4]) and not args.overrides:
        return None  # the sequence length alone is no job: it turns samples/s into tokens/s (see _cmd_logs)
    if args.build is not None:
        if any(f is not None for f in flags) or args.overrides:
            raise UsageError(
                "--build takes the job from the build; drop --spec/--model/--hardware/"
                "--gpus/--seq-length/--set, or drop --build"
            )
        return load_build(args.build)
    if all(f is None for f in flags) and not args.overrides:
        return None
    return load_flags(args.model, args.hardware, args.gpus, args.seq_length, list(args.overrides), args.spec)


def _cmd_logs(args: argparse.Namespace) -> int:
    from lmspec.compiler.errors import UsageError
    from lmspec.compiler.observe.logs.parse import parse_log
    from lmspec.compiler.observe.logs.plot import check_plot_path
    from lmspec.compiler.observe.logs.report import build_report, format_text

    if args.warmup_steps < 0:
        raise UsageError(f"--warmup-steps {args.warmup_steps}: must be 0 or more")
    if args.plot is not None:
        check_plot_path(args.plot)  # before reading a big log, not after
    parsed = parse_log(args.log, args.regex, args.warmup_steps)
    if not parsed.table.distinct:
        for note in parsed.notes:
            print(f"warning: {note}", file=sys.stderr)
        raise UsageError(
            f"{parsed.path}: no training steps found (lmspec metrics.jsonl, Megatron-LM, DeepSpeed, torchtitan "
            "and NeMo 2 logs and PyTorch-Lightning progress bars are read); describe other formats with --regex"
        )
    context = job_context(args)
    if context is None and args.seq_length is not None:
        parsed.settings["seq_length"] = args.seq_length  # over what the log printed at start-up
    if context is not None and not context.trains:
        raise UsageError(
            f"--build {args.build}: {context.plan.name} is a serve-only job (train: null) with no training numbers "
            f"to compare {parsed.path} with; drop --build, and read a vLLM log with `lmspec doctor LOG --build`"
        )
    report = build_report(parsed, context, args.warmup_steps)
    print(report.to_json() if args.format == "json" else format_text(report))
    if args.plot is not None:
        from lmspec.compiler.observe.logs.plot import draw, panels_of

        panels = panels_of(parsed.records(), context, parsed.settings.get("seq_length"))
        draw(args.plot, panels, Path(parsed.path).name, args.warmup_steps)
        if args.format == "text":
            print(f"plot: {args.plot}")
    return EXIT_OK


def register(subparsers: Any) -> None:
    from lmspec.compiler.observe.logs.stats import DEFAULT_WARMUP_STEPS

    p = subparsers.add_parser(
        "logs",
        help="tokens/s, MFU, HFU and peak memory from a training log",
        **described(
            "Read the steps of a training log (lmspec's metrics.jsonl or stdout, Megatron-LM, Megatron-DeepSpeed, "
            "GPT-NeoX, DeepSpeed, torchtitan, NeMo 2, PyTorch-Lightning's progress bar, or any format through --regex) "
            "and summarise step time, tokens/s, MFU/HFU, loss and peak memory over the steady steps; with the job "
            "(--build, or the flags) MFU uses lmspec's FLOPs model.",
            "lmspec logs runs/tiny",
            "lmspec logs train.log --build build/llama3_8b --plot steps.svg",
            "lmspec logs torchtitan.log --model llama3_8b --hardware h100_80g --gpus 64 --seq-length 8192",
            "lmspec logs my.log --regex 'step (?P<step>\\d+) loss (?P<loss>\\S+) (?P<step_time_ms>[\\d.]+)ms'",
        ),
    )
    p.add_argument(
        "log",
        type=Path,
        help="a log file (metrics.jsonl, Megatron, DeepSpeed, torchtitan, NeMo 2, Lightning, torchrun/Slurm "
        "output) or a run directory holding metrics.jsonl",
    )
    add_job_args(p)
    p.add_argument(
        "--warmup-steps",
        type=int,
        default=DEFAULT_WARMUP_STEPS,
        metavar="N",
        help=f"ignore steps 1..N in the statistics (default {DEFAULT_WARMUP_STEPS})",
    )
    p.add_argument(
        "--regex", default=None, help="read lines matching this regex; named groups: step, loss, lr, step_time_ms, ..."
    )
    p.add_argument(
        "--plot",
        type=Path,
        default=None,
        metavar="FILE.png|FILE.svg",
        help="draw loss, lr, tokens/s and MFU over steps",
    )
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.set_defaults(handler=_cmd_logs)
