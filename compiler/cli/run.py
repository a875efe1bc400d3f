"""`lmspec run BUILD_DIR [--stage STAGE] [--dry-run] [--smoke]`: execute a compiled build.

STAGES maps a stage name to "module:function", imported only when that stage runs (the
runtime's heavy imports stay out of the compiler). Each function is
`run_stage(build: Build, options: argparse.Namespace) -> int` and returns the exit code; the
build is opened here (compiler/build/reader.py: manifest checked, every file it hands out
verified), so a damaged build is refused before any runtime module is imported, and so is a
stage the job has no part for (build.training() / build.serving() name what the build is and the
stage that works). Without --stage a job that trains trains, and a serve-only job serves.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable
from pathlib import Path

from lmspec.compiler.build.reader import Build
from lmspec.compiler.cli.help_text import described
from lmspec.compiler.spec.sections import training

STAGES: dict[str, str] = {
    "train": "lmspec.runtime.train.launch:run_train",
    "import": "lmspec.runtime.convert.import_stage:run_import",
    "convert": "lmspec.runtime.convert.to_hf:run_stage",
    "verify": "lmspec.runtime.verify:run_stage",
    "quantize": "lmspec.runtime.quantize.stage:run_stage",
    "serve": "lmspec.runtime.serve.stage:run_stage",
}
SERVE_STAGE = "serve"  # the one stage of a serve-only job (train: null); every other stage needs the training
STAGE_HELP = (
    "what to run, and what each needs: "
    "train (a job that trains; the default when it does), "
    "import (a job that trains, and --from HF_DIR: a released model into a training checkpoint), "
    "convert (a job that trains and converts, and a checkpoint: writes convert.output), "
    "verify (a checkpoint and its converted model, or --from HF_DIR), "
    "quantize (a quantize section and the converted model: calibrates it with llm-compressor into "
    "quantize.output, and fails beyond quantize.max_perplexity_increase), "
    "serve (a serve section, and the model at quantize.output, convert.output or serve.model_path; the default of a "
    "serve-only job; a multi-node engine prints what to run on each node, cluster=slurm submits serve/sbatch.sh, "
    "cluster=kubernetes applies k8s/serve.yaml). A cluster=kubernetes build trains by applying k8s/train.yaml with "
    "kubectl (server-side dry run first), or prints the kubectl commands where no context is set"
)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "run",
        help="run a compiled build: train, import, convert, verify, quantize, serve",
        **described(
            "Run a build `lmspec compile` wrote (its manifest is checked first). Without --stage a job that "
            "trains trains, and a serve-only job serves.\n\n" + STAGE_HELP[0].upper() + STAGE_HELP[1:] + ".",
            "lmspec run build/tiny",
            "lmspec run build/tiny --dry-run",
            "lmspec run build/llama3_8b --stage import --from /models/Meta-Llama-3-8B",
            "lmspec run build/tiny --stage convert && lmspec run build/tiny --stage verify",
            "lmspec run build/tiny --stage quantize",
            "lmspec run build/tiny --stage serve",
        ),
    )
    p.add_argument("build_dir", type=Path, metavar="BUILD_DIR", help="a directory written by `lmspec compile`")
    p.add_argument("--stage", choices=tuple(STAGES), help=STAGE_HELP)
    p.add_argument("--dry-run", action="store_true", help="print the exact commands; run nothing")
    p.add_argument(
        "--from",
        dest="hf_dir",
        type=Path,
        metavar="HF_DIR",
        help="import: the HuggingFace directory to read; verify: the HF model to compare with (default convert.output)",
    )
    p.add_argument("--smoke", action="store_true", help="quick check that the stage can start, then exit")
    loudness = p.add_mutually_exclusive_group()
    loudness.add_argument(
        "--quiet", dest="log_level", action="store_const", const="WARNING", help="log warnings and errors only"
    )
    loudness.add_argument(
        "--verbose", dest="log_level", action="store_const", const="DEBUG", help="log debug lines, on every rank"
    )
    p.set_defaults(handler=run_build)


def stage_function(stage: str) -> Callable[[Build, argparse.Namespace], int]:
    module, _, function = STAGES[stage].partition(":")
    return getattr(importlib.import_module(module), function)


def run_build(args: argparse.Namespace) -> int:
    from lmspec.runtime.log import setup_logging

    # this process's stage output, and $LMSPEC_LOG_LEVEL for the ranks the launch scripts start
    setup_logging(args.log_level, capture_warnings=False)
    build = Build.open(args.build_dir, cost_model=True)  # plan.json whole, once, before anything starts
    trains = training(build.spec) is not None
    stage = args.stage or ("train" if trains else SERVE_STAGE)
    if stage == SERVE_STAGE:
        build.serving()
    else:
        build.training()
    return stage_function(stage)(build, args)
