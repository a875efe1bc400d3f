"""The serve stage of `lmspec run`: the build's serve/serve.sh under watch, checked by requests.

It starts serve/serve.sh (vLLM with serve/vllm.yaml) in its own process group, logging to
runs/<name>/vllm.log, waits for /health with a progress line, then checks what a client
needs: /v1/models lists the served name, a request without the key is refused when a key is
set, and one /v1/completions answers. Then it prints the endpoint and keeps serving until
Ctrl-C or SIGTERM, which stop the whole group; `--smoke` stops right after the checks.

A model without tokenizer files (serve.model_path naming one; the converter writes the tokenizer
beside every model) gets the training tokenizer written to runs/<name>/tokenizer and passed as
`--tokenizer` (vLLM needs one to take text prompts).
The spec is the typed one of compiler/build/reader.py, and serve.sh and vllm.yaml are checked
against manifest.json before anything starts; so is the served config.json against the spec
(compiler/serve_config.py: the model, tp against its heads, max_model_len, expert parallel,
quantization), every problem listed (exit 2) before vLLM is started.
Which engine this machine starts is the launcher's (runtime/launchers/): cluster.launcher=local serves a
one-node engine here (`serve_here`) and prints each node's command for one on several nodes; slurm submits
serve/sbatch.sh.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from lmspec.compiler.build.files import SERVE_SH, TOKENIZER_DIR, VLLM_LOG
from lmspec.compiler.build.reader import Build
from lmspec.compiler.endpoint import endpoint
from lmspec.compiler.errors import EXIT_FAILED, EXIT_OK, UsageError
from lmspec.compiler.launch_names import CPU_VLLM_CLI, VLLM_CLI_ENV
from lmspec.compiler.models.dims import device_kind
from lmspec.compiler.models.units import DTYPE_BYTES
from lmspec.compiler.plan import Plan
from lmspec.compiler.quantize_modules import expert_patterns, kept_modules, quantized_model
from lmspec.compiler.serve_config import served_config_problems
from lmspec.compiler.spec.sections import ServingSpec
from lmspec.compiler.vllm_cpu import cpu_attention_problems
from lmspec.runtime.launchers import runtime_of
from lmspec.runtime.process_group import EXIT_SIGINT, EXIT_SIGTERM, Terminated, sigterm_raises, stop_group
from lmspec.runtime.quantize.quality import published_problems
from lmspec.runtime.slurm import in_container

logger = logging.getLogger(__name__)

HEALTH_TIMEOUT_S = 1800.0  # loading hundreds of GB of weights takes many minutes; tiny on CPU ~30-60 s
HEALTH_POLL_S = 1.0
PROGRESS_EVERY_S = 10.0  # progress line interval when stdout is not a terminal
REQUEST_TIMEOUT_S = 120.0
SMOKE_PROMPT = "The"
SMOKE_MAX_TOKENS = 8
LOG_TAIL_LINES = 30


class ServeFailure(Exception):
    """vLLM did not come up or did not answer as a client needs."""


def run_stage(build: Build, options: argparse.Namespace) -> int:
    spec = build.serving()
    launcher = runtime_of(spec.cluster)
    for rel in launcher.engine_files(
        build.plan.served().layout
    ):  # what bash and vLLM read: as compiled, or nothing starts
        build.script(rel)
    env = dict(os.environ)
    cli = Path(sys.executable).parent / CPU_VLLM_CLI
    if cli.is_file() and not in_container(spec.cluster):  # in a container the image's vLLM runs
        env.setdefault(VLLM_CLI_ENV, str(cli))
    prefix = f"{VLLM_CLI_ENV}={shlex.quote(env[VLLM_CLI_ENV])} " if VLLM_CLI_ENV in env else ""
    return launcher.start_serving(build, env, prefix, options)


def node_flags(plan: Plan, *, dry_run: bool) -> list[str]:
    """For an engine this machine does not start (a batch job's, or one on several nodes): the served model
    checked where it is here, and the vLLM flags every node's script gets. The tokenizer is written under
    runs/, which every node reads from the same directory; a dry run checks and writes nothing."""
    if dry_run:
        return []
    check_served_model(plan, required=False)  # the nodes read the model; here it may not be reachable
    return _tokenizer_flags(plan)


def serve_here(build: Build, env: dict[str, str], env_prefix: str, options: argparse.Namespace) -> int:
    """A one-node engine started on this machine (its launcher's choice): serve/serve.sh under watch."""
    spec, plan = build.serving(), build.plan
    command = ["bash", str(build.root.resolve() / SERVE_SH)]
    if options.dry_run:
        print(env_prefix + shlex.join(command))
        return EXIT_OK
    _preflight(plan, env)
    command += _tokenizer_flags(plan)
    log_path = Path(plan.paths.run_dir) / VLLM_LOG
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            command, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
    try:
        with sigterm_raises():
            return _serve(spec, proc, env, log_path, smoke=options.smoke)
    except ServeFailure as exc:
        logger.error(f"serve: FAILED: {exc}")
        _log_tail(log_path)
        stop_group(proc, sweep=True)
        return EXIT_FAILED
    except KeyboardInterrupt:
        logger.warning("\nserve: interrupted; stopping vLLM")
        stop_group(proc, sweep=True)
        return EXIT_SIGINT
    except Terminated:
        stop_group(proc, sweep=True)
        return EXIT_SIGTERM


def _serve(
    spec: ServingSpec, proc: subprocess.Popen[bytes], env: dict[str, str], log_path: Path, *, smoke: bool
) -> int:
    v = spec.serve
    base = endpoint(v.host, v.port, path="")
    key = env.get(v.api_key_env) if v.api_key_env else None
    _wait_healthy(proc, base, log_path)
    check_endpoint(base, v.served_model_name, key)
    logger.info(
        f"serving {v.served_model_name} at {base}/v1 (OpenAI-compatible"
        + (f"; key from ${v.api_key_env}" if key else "; no API key")
        + f"); log: {log_path}"
    )
    if smoke:
        stop_group(proc, sweep=True)
        logger.info("serve: smoke checks passed; vLLM stopped")
        return EXIT_OK
    logger.info("serve: Ctrl-C stops the server")
    rc = proc.wait()
    if rc != 0:
        raise ServeFailure(f"vLLM exited with code {rc}")
    return rc


def check_endpoint(base: str, served_name: str, key: str | None) -> None:
    """The client's view: the name is listed, the key is enforced, a completion comes back."""
    models = request_json(f"{base}/v1/models", key)
    names = [m.get("id") for m in models.get("data", [])]
    if served_name not in names:
        raise ServeFailure(f"/v1/models lists {names}, not serve.served_model_name={served_name!r}")
    if key is not None:
        try:
            request_json(f"{base}/v1/models", None)
        except ServeFailure as exc:
            if "HTTP 401" not in str(exc):
                raise
        else:
            raise ServeFailure("/v1/models answered without the API key: the key is not enforced")
    body = {"model": served_name, "prompt": SMOKE_PROMPT, "max_tokens": SMOKE_MAX_TOKENS, "temperature": 0}
    answer = request_json(f"{base}/v1/completions", key, body)
    choices, usage = answer.get("choices") or [{}], answer.get("usage") or {}
    if not isinstance(choices[0].get("text"), str) or not usage.get("completion_tokens"):
        raise ServeFailure(f"/v1/completions gave no completion: {json.dumps(answer)[:300]}")
    logger.info(f"completion ({usage['completion_tokens']} tokens): {SMOKE_PROMPT!r} -> {choices[0]['text']!r}")


def request_json(url: str, key: str | None, body: dict[str, Any] | None = None) -> dict[str, Any]:
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT_S) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        raise ServeFailure(f"{url}: HTTP {exc.code} {exc.read()[:300]!r}") from None
    except (urllib.error.URLError, TimeoutError, ValueError) as exc:
        raise ServeFailure(f"{url}: {exc}") from None


def _wait_healthy(proc: subprocess.Popen[bytes], base: str, log_path: Path) -> None:
    tty, started, shown = sys.stdout.isatty(), time.monotonic(), -PROGRESS_EVERY_S
    while True:
        waited = time.monotonic() - started
        if proc.poll() is not None:
            raise ServeFailure(f"vLLM exited with code {proc.returncode} before /health answered")
        if _healthy(f"{base}/health"):
            if tty:
                print()
            logger.info(f"vLLM healthy after {waited:.0f} s")
            return
        if waited > HEALTH_TIMEOUT_S:
            raise ServeFailure(f"/health did not answer within {HEALTH_TIMEOUT_S:.0f} s")
        line = f"waiting for vLLM at {base}/health: {waited:.0f} s (log: {log_path})"
        if tty:
            print(f"\r{line}\033[K", end="", flush=True)
        elif waited - shown >= PROGRESS_EVERY_S:
            print(line, flush=True)
            shown = waited
        time.sleep(HEALTH_POLL_S)


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=HEALTH_POLL_S * 5) as response:
            return response.status == 200
    except (urllib.error.URLError, TimeoutError, ConnectionError):
        return False


def _tokenizer_flags(plan: Plan) -> list[str]:
    """`--tokenizer DIR` with the training tokenizer when the served model directory has none (a model
    from serve.model_path; the converter puts the tokenizer beside every model it writes)."""
    from lmspec.runtime.data.byte_tokenizer import has_tokenizer
    from lmspec.runtime.data.training_tokenizer import training_tokenizer

    model = Path(plan.served().model_dir)
    if not model.is_dir() or has_tokenizer(model):
        return []
    train = plan.spec.train
    if train is None:
        raise UsageError(
            f"serve.model_path={str(model)!r} has no tokenizer (no tokenizer.json or tokenizer_config.json) and a "
            "serve-only job has no training tokenizer to lend it; copy the model's tokenizer files into it"
        )
    directory = Path(plan.paths.run_dir) / TOKENIZER_DIR
    directory.mkdir(parents=True, exist_ok=True)
    training_tokenizer(train.data).write(directory)
    logger.info(f"serve: {model} has no tokenizer; serving with the training tokenizer written to {directory}")
    return ["--tokenizer", str(directory)]


def check_served_model(plan: Plan, *, required: bool) -> None:
    """The served directory holds the spec's model (compiler/serve_config.py), every difference named;
    a directory not here is an error when this machine starts vLLM (`required`), else left to the nodes."""
    spec = plan.served().spec
    v, model = spec.serve, Path(plan.served().model_dir)
    config_path = model / "config.json"
    if not config_path.is_file():
        if not required:
            logger.info(
                f"serve: no {config_path} on this machine: the served model is not checked against the spec here"
            )
            return
        if v.model_path:
            raise UsageError(
                f"serve.model_path={v.model_path!r}: no model there (no config.json under {Path.cwd()}); put the "
                "HF model directory there (config.json, weights, tokenizer) or compile with serve.model_path=DIR"
            )
        if spec.quantize is not None:
            raise UsageError(
                f"quantize.output={str(model)!r}: no quantized model there (no config.json under {Path.cwd()}); "
                "run `lmspec run BUILD --stage quantize` first"
            )
        raise UsageError(
            f"convert.output={str(model)!r}: no model there (no config.json under {Path.cwd()}); run "
            "`lmspec run BUILD --stage convert` first, or compile with serve.model_path=DIR"
        )
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(f"{config_path}: not a readable config.json ({exc})") from None
    if not isinstance(config, dict):
        raise UsageError(f"{config_path} holds a JSON {type(config).__name__}, not a config object")
    problems = served_config_problems(spec, config)
    if spec.quantize is not None and v.model_path is None:
        problems += published_problems(spec.quantize, model)
    if problems:
        listed = "".join(f"\n  - {p}" for p in problems)
        raise UsageError(f"{config_path} is not what the spec serves ({len(problems)} problem(s)):{listed}")


def _require_quantized_expert_kernels(spec: ServingSpec) -> None:
    """vLLM's CPU engine runs quantized MoE experts (CPUExpertsInt4/Int8) only on a CPU with AMX tiles; where
    it has none, vLLM would fail minutes later with "No WNA16 MoE backend supports the deployment"."""
    q = spec.quantize
    if q is None or spec.model.moe is None or spec.serve.model_path is not None or device_kind(spec) != "cpu":
        return
    if quantized_model(spec, DTYPE_BYTES["bfloat16"]).experts.quantized_params == 0:
        return
    import torch

    if torch.cpu._is_amx_tile_supported():
        return
    kept = ", ".join((*kept_modules(spec), *expert_patterns(spec.model)))
    raise UsageError(
        f"quantize.keep: the quantized MoE experts of {q.output} need AMX tiles on vLLM's CPU engine "
        "(CPUExpertsInt4/Int8), and this CPU has none; serve on GPUs or an AMX CPU, or keep the experts in "
        f"the model's dtype: quantize.keep=[{kept}], then quantize again"
    )


def _preflight(plan: Plan, env: dict[str, str]) -> None:
    """The mistakes that would otherwise surface as a vLLM traceback minutes later."""
    spec = plan.served().spec
    v = spec.serve
    # what compile only warns about on a train+serve job (it trains), the serve stage refuses
    cpu = [p.message for p in cpu_attention_problems(spec, plan.origins)]
    if cpu:
        raise UsageError("vLLM's CPU backend cannot serve this model: " + "; ".join(cpu))
    check_served_model(plan, required=True)
    _require_quantized_expert_kernels(spec)
    if v.api_key_env and not env.get(v.api_key_env):
        raise UsageError(
            f"serve.api_key_env={v.api_key_env}: set ${v.api_key_env} to the API key clients must "
            "send, or compile with serve.api_key_env=null to serve without one"
        )
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        # as vLLM's own server socket: the TIME_WAIT connections of a server just stopped do not hold the
        # port, a socket listening on it does
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((v.host, v.port))
        except OSError as exc:
            raise UsageError(
                f"serve.port={v.port}: cannot listen on {v.host}:{v.port} ({exc.strerror}); stop "
                "what holds it or compile with another serve.port"
            ) from None


def _log_tail(log_path: Path) -> None:
    """vLLM's last lines, with the failure they explain: one record, so a rank prefix heads the block once."""
    try:
        lines = log_path.read_text(encoding="utf-8", errors="replace").splitlines()[-LOG_TAIL_LINES:]
    except OSError:
        return
    logger.error("\n".join([f"--- last {len(lines)} lines of {log_path} ---", *lines]))
