"""An LMSPEC_PYTHON wrapper that keeps the real interpreter and torchrun but swaps the trainer
module for allreduce_worker.py, so launch tests exercise the real launch path quickly."""

from __future__ import annotations

import sys
from pathlib import Path

WORKER = Path(__file__).with_name("allreduce_worker.py")
SWAP_TRAINER = f"""#!{sys.executable}
# The real interpreter and torchrun; `-m lmspec.runtime.train BUILD` becomes `{WORKER.name} BUILD`.
import os, sys
argv = sys.argv[1:]
if "lmspec.runtime.train" in argv:
    i = argv.index("lmspec.runtime.train")
    argv[i - 1:i + 1] = [{str(WORKER)!r}]
os.execv(sys.executable, [sys.executable, *argv])
"""


def write_wrapper(directory: Path) -> Path:
    wrapper = directory / "python-swap-trainer"
    wrapper.write_text(SWAP_TRAINER)
    wrapper.chmod(0o755)
    return wrapper
