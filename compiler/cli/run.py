"""`lmspec run BUILD_DIR [--stage STAGE] [--dry-run] [--smoke]`: execute a compiled build.

STAGES maps a stage name to "module:function", imported only when that stage runs (the
runtime's heavy imports stay out of the compiler). Each function is
`run_stage(build: Build, options: argparse.Namespace) -> int` and returns the exit code; the
build is opened here (compiler/build/reader.py: manifest checked, every file it hands out
verified), so a damaged build is refused before any runtime module is imported.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable
from pathlib import Path

from lmspec.compiler.build.reader import Build

STAGES: dict[str, str] = {
    "train": "lmspec.runtime.train.launch:run_train",
    "import": "lmspec.runtime.convert.import_stage:run_import",
    "convert": "lmspec.runtime.convert.to_hf:run_stage",
    "verify": "lmspec.runtime.verify:run_stage",
    "serve": "lmspec.runtime.serve.stage:run_stage",
}
DEFAULT_STAGE = "train"


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("run", help="run a compiled build: train (default), import, convert, verify, serve")
    p.add_argument("build_dir", type=Path, metavar="BUILD_DIR", help="a directory written by `lmspec compile`")
    p.add_argument("--stage", choices=tuple(STAGES), default=DEFAULT_STAGE, help="what to run (default: train)")
    p.add_argument("--dry-run", action="store_true", help="print the exact commands; run nothing")
    p.add_argument(
        "--from",
        dest="hf_dir",
        type=Path,
        metavar="HF_DIR",
        help="import: the HuggingFace directory to read; verify: the HF model to compare with (default convert.output)",
    )
    p.add_argument("--smoke", action="store_true", help="quick check that the stage can start, then exit")
    p.set_defaults(handler=run_build)


def stage_function(stage: str) -> Callable[[Build, argparse.Namespace], int]:
    module, _, function = STAGES[stage].partition(":")
    return getattr(importlib.import_module(module), function)


def run_build(args: argparse.Namespace) -> int:
    build = Build.open(args.build_dir)
    return stage_function(args.stage)(build, args)
