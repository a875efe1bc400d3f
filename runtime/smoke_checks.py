"""`--smoke` of a stage that launches through scripts: each check a command that must exit 0, run in order.

Training (runtime/train/launch.py) and a Slurm-submitted engine (runtime/launchers/slurm.py) ask the same
kind of question, "could this start?", without starting anything: one line per check, the first failure
with its command and stderr ends the run with exit 1.
"""

from __future__ import annotations

import logging
import shlex
import subprocess

from lmspec.compiler.errors import EXIT_FAILED, EXIT_OK

logger = logging.getLogger(__name__)

Check = tuple[str, list[str]]  # (what it proves, the command)


def run_checks(checks: list[Check], env: dict[str, str]) -> int:
    for label, check in checks:
        try:
            result = subprocess.run(check, env=env, capture_output=True, text=True, check=False)
        except FileNotFoundError as exc:
            logger.error(f"smoke: FAILED {label}: {check[0]}: {exc.strerror}")
            return EXIT_FAILED
        if result.returncode != 0:
            logger.error(f"smoke: FAILED {label}: {shlex.join(check)}\n{result.stderr.strip()}")
            return EXIT_FAILED
        print(f"smoke: ok {label}")  # the checklist --smoke was asked for: its product, at any log level
    return EXIT_OK
