"""One vLLM engine of tensor parallel 2 over two namespace hosts (helpers.netns), asked from the second host:
what the mp-mode test and the LeaderWorkerSet test both prove once their processes are started."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest

from helpers.netns import Host, ask

START_TIMEOUT_S = 600.0  # two vLLM process trees take ~1-2 min to be healthy on 2 idle cores


def wait_healthy(client: Host, url: str, procs: list[subprocess.Popen], logs: list[Path]) -> None:
    """Until `url` (/health) answers `client`; fails with the log of a process that exited, or of all at timeout."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        for proc, log in zip(procs, logs, strict=True):
            if proc.poll() is not None:
                pytest.fail(f"{log.name} exited {proc.returncode}:\n{log.read_text()[-4000:]}")
        if ask(client, url).returncode == 0:
            return
        time.sleep(3)
    pytest.fail("no /health within the start timeout:\n" + "\n".join(log.read_text()[-3000:] for log in logs))


def assert_one_tp2_engine_answers(client: Host, api: str, model: str, worker_log: Path) -> str:
    """A completion from `api` answered by one engine of two tensor-parallel ranks, rank 1 on the worker's
    host; the worker's log, for the caller's own checks."""
    body = {"model": model, "prompt": "hello", "max_tokens": 4, "temperature": 0}
    answered = ask(client, f"{api}/v1/completions", body)
    assert answered.returncode == 0, answered.stderr
    answer = json.loads(answered.stdout)
    assert answer["usage"]["completion_tokens"] == 4 and answer["choices"][0]["text"], answer
    assert "-tp2-" in answer["system_fingerprint"], answer
    worker = worker_log.read_text()
    assert re.search(r"rank 1 in world size 2 is assigned as .*TP rank 1", worker), worker[-3000:]
    return worker
