"""`lmspec schema`: the spec's JSON Schema on stdout, for editors and other tools."""

from __future__ import annotations

import argparse
import sys

from lmspec.compiler.cli.help_text import described
from lmspec.compiler.errors import EXIT_OK


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "schema",
        help="print the spec's JSON Schema",
        **described(
            "Print the JSON Schema of a spec file (every key, its type, range and description): for editors "
            "(yaml-language-server) and for checking specs outside lmspec.",
            "lmspec schema > schemas/spec.schema.json",
        ),
    )
    p.set_defaults(handler=_cmd_schema)


def _cmd_schema(args: argparse.Namespace) -> int:
    from lmspec.compiler.spec.schema import spec_schema_text

    sys.stdout.write(spec_schema_text())
    return EXIT_OK
