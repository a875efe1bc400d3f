"""vLLM's verdict on many `vllm` command lines at once: `lmspec-vllm --check-batch` in one process (vLLM's
import costs seconds, parsing milliseconds), offline, with its caches under the test's directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from lmspec.runtime.serve.vllm_cli import CHECK_RESULT_PREFIX

CHECK_TIMEOUT_S = 600


def check_batch(argvs: list[list[str]], root: Path) -> list[dict[str, Any]]:
    """One result per argv, in order: {"exit", "error", "args"} (runtime/serve/vllm_cli.py)."""
    batch = root / "argvs.json"
    batch.write_text(json.dumps(argvs))
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "VLLM_CACHE_ROOT": str(root / "vllm_cache"),
        "VLLM_CPU_KVCACHE_SPACE": "1",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "lmspec.runtime.serve.vllm_cli", "--check-batch", str(batch)],
        env=env,
        capture_output=True,
        text=True,
        timeout=CHECK_TIMEOUT_S,
        start_new_session=True,
        check=False,
    )
    results = [
        json.loads(line[len(CHECK_RESULT_PREFIX) :])
        for line in proc.stdout.splitlines()
        if line.startswith(CHECK_RESULT_PREFIX)
    ]
    assert len(results) == len(argvs), proc.stderr[-3000:]
    return results
