"""`lmspec schema`: the spec's JSON Schema on stdout, for editors and other tools."""

from __future__ import annotations

import argparse
import sys

from lmspec.compiler.errors import EXIT_OK


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("schema", help="print the spec's JSON Schema")
    p.set_defaults(handler=_cmd_schema)


def _cmd_schema(args: argparse.Namespace) -> int:
    from lmspec.compiler.spec.schema import spec_schema_text

    sys.stdout.write(spec_schema_text())
    return EXIT_OK
