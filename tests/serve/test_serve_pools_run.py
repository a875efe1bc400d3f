"""Disaggregated prefill and decode run for real: the tiny model's two pools (serve.disaggregation), each one
vLLM engine on a GPU of its own on this machine, started by the build's serve/prefill/serve.sh and
serve/decode/serve.sh and joined by NixlConnector. A request goes as vLLM's disaggregation proxy sends it:
to the prefill engine with max_tokens 1 and do_remote_decode, then to the decode engine with the
kv_transfer_params the prefill engine answered, and the decode engine completes it from the moved KV cache.

Skips without two CUDA GPUs and NIXL: the connector moves KV blocks between GPU engines over UCX (RDMA or
TCP), which vLLM's CPU build has neither of; tests/serve/test_vllm_judge_scale.py judges both pools'
configuration with vLLM's parser and engine config everywhere.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from helpers.build import compile_build
from helpers.hf import save_random_hf_llama
from helpers.marks import needs_vllm
from helpers.ports import free_port
from helpers.processes import kill_group

from lmspec.compiler.build.files import pool_files
from lmspec.runtime.data.byte_tokenizer import save_byte_tokenizer


def _cuda_gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


pytestmark = [
    needs_vllm,
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("nixl") is None or _cuda_gpus() < 2,
        reason="NixlConnector moves KV blocks between two GPU engines over UCX: needs 2 CUDA GPUs and NIXL",
    ),
]

START_TIMEOUT_S = 900.0
LOOPBACK = "127.0.0.1"


def _post(port: int, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        f"http://{LOOPBACK}:{port}/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=300) as response:
        return dict(json.loads(response.read()))


def _wait_healthy(ports: list[int], procs: list[subprocess.Popen], logs: list[Path]) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    waiting = set(ports)
    while waiting and time.monotonic() < deadline:
        for proc, log in zip(procs, logs, strict=True):
            if proc.poll() is not None:
                pytest.fail(f"{log.name} exited {proc.returncode}:\n{log.read_text()[-4000:]}")
        for port in list(waiting):
            try:
                urllib.request.urlopen(f"http://{LOOPBACK}:{port}/health", timeout=5).close()
                waiting.discard(port)
            except OSError:
                time.sleep(2)
    if waiting:
        pytest.fail("no /health within the start timeout:\n" + "\n".join(log.read_text()[-3000:] for log in logs))


def test_a_request_prefilled_on_one_engine_is_decoded_on_the_other(tmp_path: Path) -> None:
    model = tmp_path / "models" / "tiny"
    save_random_hf_llama(compile_build(tmp_path / "probe", [])[0], model)  # the tiny spec's model, random weights
    save_byte_tokenizer(model)
    plan, build = compile_build(
        tmp_path / "build",
        [
            "hardware=h100_80g",
            "hardware.nodes=2",
            "train=null",
            "parallel=null",
            "convert=null",
            f"serve.model_path={model}",
            "serve.tp=1",
            "serve.max_model_len=256",
            "serve.host=0.0.0.0",
            "serve.api_key_env=null",
            "serve.gpu_memory_utilization=0.3",
            "serve.disaggregation={kv_connector: NixlConnector, prefill: {tp: 1, dp: 1, engines: 1}, "
            "decode: {tp: 1, dp: 1, engines: 1}}",
        ],
    )
    name = plan.served().spec.serve.served_model_name
    ports = [free_port(), free_port()]
    procs: list[subprocess.Popen] = []
    logs = [tmp_path / "prefill.log", tmp_path / "decode.log"]
    try:
        for gpu, (pool, port, log) in enumerate(zip(("prefill", "decode"), ports, logs, strict=True)):
            # one machine holds both pools: each engine its own GPU, API port and NIXL side channel
            env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(gpu), "VLLM_NIXL_SIDE_CHANNEL_PORT": str(free_port())}
            script = build / pool_files(pool)[1]
            with log.open("w") as out:
                procs.append(
                    subprocess.Popen(
                        ["bash", str(script), "--port", str(port)],
                        cwd=tmp_path,
                        env=env,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
        _wait_healthy(ports, procs, logs)
        prompt = {"model": name, "prompt": "hello there", "temperature": 0}
        remote_decode = {"do_remote_decode": True, "do_remote_prefill": False}
        prefilled = _post(ports[0], {**prompt, "max_tokens": 1, "kv_transfer_params": remote_decode})
        handed = prefilled.get("kv_transfer_params")
        assert handed and handed.get("remote_block_ids"), prefilled  # the prefill engine kept the blocks for us
        decoded = _post(ports[1], {**prompt, "max_tokens": 8, "kv_transfer_params": handed})
        assert decoded["choices"][0]["text"] is not None and decoded["usage"]["completion_tokens"] >= 1, decoded
    finally:
        for proc in procs:
            kill_group(proc)
