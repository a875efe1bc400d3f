"""`lmspec run BUILD_DIR [--stage STAGE] [--dry-run] [--smoke]`: execute a compiled build.

STAGES maps a stage name to "module:function", imported only when that stage runs (the
runtime's heavy imports stay out of the compiler). Each function is
`run_stage(build_dir: Path, options: argparse.Namespace) -> int` and returns the exit code.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable
from pathlib import Path

from compiler.errors import UsageError
from compiler.paths import display_path

STAGES: dict[str, str] = {
    "train": "runtime.launch:run_train",
    "convert": "runtime.convert:run_stage",
    "verify": "runtime.verify:run_stage",
    "serve": "runtime.serve:run_stage",
}
DEFAULT_STAGE = "train"


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("run", help="run a compiled build: train (default), convert, verify, serve")
    p.add_argument("build_dir", type=Path, metavar="BUILD_DIR", help="a directory written by `lmspec compile`")
    p.add_argument("--stage", choices=tuple(STAGES), default=DEFAULT_STAGE, help="what to run (default: train)")
    p.add_argument("--dry-run", action="store_true", help="print the exact commands; run nothing")
    p.add_argument("--smoke", action="store_true", help="quick check that the stage can start, then exit")
    p.set_defaults(handler=run_build)


def stage_function(stage: str) -> Callable[[Path, argparse.Namespace], int]:
    module, _, function = STAGES[stage].partition(":")
    return getattr(importlib.import_module(module), function)


def run_build(args: argparse.Namespace) -> int:
    build: Path = args.build_dir
    if not (build / "manifest.json").is_file():
        raise UsageError(
            f"{display_path(build)} is not a build directory (no manifest.json); "
            "compile one with `lmspec compile` and pass build/<name>"
        )
    return stage_function(args.stage)(build, args)
