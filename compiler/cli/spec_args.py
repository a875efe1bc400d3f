"""The arguments naming a spec, shared by every command that compiles one: `--spec` and Hydra overrides."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_spec_args(parser: argparse.ArgumentParser) -> None:
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
