"""`lmspec doctor`: known failure signatures in a log, each with its cause, the evidence lines
and the spec keys to change. Exit 1 when a problem is found, 0 when none is."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def _cmd_doctor(args: argparse.Namespace) -> int:
    import dataclasses

    from compiler.doctor import SIGNATURES, diagnose
    from compiler.doctor.findings import LogText
    from compiler.logs.parse import read_raw_lines, resolve_log
    from compiler.logs_command import job_context

    path = resolve_log(args.log)
    log = LogText(read_raw_lines(path))
    findings = diagnose(log, job_context(args))
    if args.format == "json":
        print(json.dumps([dataclasses.asdict(f) for f in findings], indent=2))
    elif findings:
        print("\n\n".join(f.text() for f in findings))
        print(f"\n{path}: {len(findings)} problem(s) found")
    else:
        print(f"{path}: healthy — none of {len(SIGNATURES)} known failure signatures in {len(log.lines)} lines")
    return 1 if findings else 0


def register(subparsers: Any) -> None:
    from compiler.logs_command import add_job_args

    p = subparsers.add_parser("doctor", help="recognise known failures in a log and name the spec keys to change")
    p.add_argument("log", type=Path, help="a training or serving log (or a run directory)")
    add_job_args(p)
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.set_defaults(handler=_cmd_doctor)
