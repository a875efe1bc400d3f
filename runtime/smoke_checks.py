"""`--smoke` of a stage that launches through scripts: each check a command that must exit 0, run in order.

Training (runtime/train/launch.py) and a Slurm-submitted engine (runtime/serve/cluster.py) ask the same
kind of question, "could this start?", without starting anything: one line per check, the first failure
with its command and stderr ends the run with exit 1.
"""

from __future__ import annotations

import shlex
import subprocess
import sys

from lmspec.compiler.errors import EXIT_FAILED, EXIT_OK

Check = tuple[str, list[str]]  # (what it proves, the command)


def run_checks(checks: list[Check], env: dict[str, str]) -> int:
    for label, check in checks:
        try:
            result = subprocess.run(check, env=env, capture_output=True, text=True, check=False)
        except FileNotFoundError as exc:
            print(f"smoke: FAILED {label}: {check[0]}: {exc.strerror}", file=sys.stderr)
            return EXIT_FAILED
        if result.returncode != 0:
            print(f"smoke: FAILED {label}: {shlex.join(check)}\n{result.stderr.strip()}", file=sys.stderr)
            return EXIT_FAILED
        print(f"smoke: ok {label}")
    return EXIT_OK
