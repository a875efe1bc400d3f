"""`lmspec doctor`: known failure signatures in a log, each with its cause, the evidence lines
and the spec keys to change. Exit 1 when a problem is found, 0 when none is."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from lmspec.compiler.cli.help_text import described


def _cmd_doctor(args: argparse.Namespace) -> int:
    import dataclasses
    import sys

    from lmspec.compiler.cli.logs import job_context
    from lmspec.compiler.observe.doctor import SIGNATURES, WATCHES, diagnose
    from lmspec.compiler.observe.doctor.findings import LogText
    from lmspec.compiler.observe.logs.parse import resolve_log
    from lmspec.compiler.observe.logs.reader import MAX_LINE_BYTES, LogFile

    path = resolve_log(args.log)
    source = LogFile(path)  # refuses what cannot be read as a log before the job is resolved
    context = job_context(args)
    log = LogText.scan(source, WATCHES)
    if log.long_lines:
        kib = MAX_LINE_BYTES // 1024
        print(
            f"warning: {path}: {log.long_lines} line(s) longer than {kib} KiB: "
            f"only the first {kib} KiB of each were read",
            file=sys.stderr,
        )
    findings = diagnose(log, context)
    if args.format == "json":
        print(json.dumps([dataclasses.asdict(f) for f in findings], indent=2))
    elif findings:
        print("\n\n".join(f.text() for f in findings))
        print(f"\n{path}: {len(findings)} problem(s) found")
    else:
        print(f"{path}: healthy — none of {len(SIGNATURES)} known failure signatures in {log.line_count} lines")
    return 1 if findings else 0


def register(subparsers: Any) -> None:
    from lmspec.compiler.cli.logs import add_job_args

    p = subparsers.add_parser(
        "doctor",
        help="recognise known failures in a log and name the spec keys to change",
        **described(
            "Read a training or serving log (Megatron-LM, DeepSpeed, torchtitan, vLLM, torchrun, Slurm output, "
            "what kubectl describe, get events and logs show) for known failure signatures: NCCL timeouts and "
            "network errors, rendezvous failures, CUDA and host OOM, NaN loss, Slurm time limits and preemption, "
            "Kubernetes pods OOMKilled, evicted, unschedulable, without their image or stopped before their "
            "checkpoint was saved, checkpoint mismatches, vLLM KV cache and parallel errors. Each finding quotes "
            "its log lines and names the spec keys to change, with values computed "
            "from the build when --build (or the job flags) is given. Exit 0 healthy, 1 a failure found.",
            "lmspec doctor runs/tiny/train.log",
            "lmspec doctor slurm-train-4242.out --build build/llama3_8b",
            "lmspec doctor vllm.log --format json",
            "lmspec doctor pods.txt --build build/llama3_8b   # kubectl describe pods ... > pods.txt",
        ),
    )
    p.add_argument("log", type=Path, help="a training or serving log (or a run directory)")
    add_job_args(p)
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.set_defaults(handler=_cmd_doctor)
