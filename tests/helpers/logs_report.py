"""`lmspec logs` as the logs tests call it: the JSON report of a log, and the Llama 3 8B run the
healthy excerpts stand for (it only fits with the distributed optimizer: the budget rule)."""

from __future__ import annotations

import json
from typing import Any

LLAMA_FLAGS = (
    "--model",
    "llama3_8b",
    "--hardware",
    "h100_80g",
    "--gpus",
    "64",
    "--seq-length",
    "4096",
    "--set",
    "parallel.distributed_optimizer=true",
)


def logs_report(lmspec: Any, *argv: str) -> dict:
    """The JSON report `lmspec logs ARGV --format json` prints; the command must succeed."""
    result = lmspec("logs", *argv, "--format", "json")
    assert result.code == 0, result.err
    return json.loads(result.out)
