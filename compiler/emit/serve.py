"""serve/vllm.yaml and the scripts that start vLLM on the engine's nodes, from the same Plan.

A one-node engine is serve/serve.sh; a multi-node one (lmspec.compiler.models.serve_layout) is
serve/head.sh on node 0 and serve/worker.sh on the others, each running `vllm serve --config
vllm.yaml` plus its role's flags (`role_flags`, the one list the scripts and the tests read),
or, for a Ray worker, only `ray start`. cluster=slurm adds serve/sbatch.sh: the whole engine
as one Slurm job.

`vllm_options` is the single list of vLLM options; vllm.yaml (for `vllm serve --config`) and
`vllm_serve_args` (the same options as command-line flags, as vLLM itself expands a config file)
are two spellings of it. YAML values are JSON scalars; shell values are quoted (lmspec.compiler.emit.quoting).
The API key never appears in an artifact: serve.sh reads it from the variable named by
`serve.api_key_env` and hands it to vLLM as VLLM_API_KEY (environment, not argv).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

from lmspec.compiler.build.files import (
    NCCL_ENV,
    SERVE_HEAD_SH,
    SERVE_POOLS,
    SERVE_SBATCH_SH,
    SERVE_SH,
    SERVE_WORKER_SH,
    VLLM_CACHE_DIR,
    VLLM_YAML,
    pool_files,
    serve_scripts,
)
from lmspec.compiler.emit import rack, site
from lmspec.compiler.emit.nccl import cpu_ranks
from lmspec.compiler.emit.quoting import Quoted, directive, shell, word
from lmspec.compiler.emit.render import render
from lmspec.compiler.endpoint import endpoint
from lmspec.compiler.launch_names import CPU_VLLM_CLI, PYTHON_ENV, VLLM_CLI_ENV
from lmspec.compiler.launchers import launcher_of
from lmspec.compiler.models.serve_layout import RoleName
from lmspec.compiler.plan import Plan
from lmspec.compiler.vllm_args import config_words, yaml_entry

VLLM_API_KEY_ENV = "VLLM_API_KEY"  # the variable vLLM itself reads the key from
KV_ROLES = {"prefill": "kv_producer", "decode": "kv_consumer"}  # vLLM's kv_role of each disaggregated pool
# vLLM 0.32 on CPU picks its AMX MLA backend where the CPU has AMX, and that takes bf16 weights only;
# its reference CPU_MLA backend also runs fp32 (what the cpu hardware serves in).
CPU_MLA_BACKEND = "CPU_MLA"
RAY_WAIT_ENV = "LMSPEC_RAY_WAIT_S"  # how long head.sh waits for the Ray workers; named in serve_head.sh.j2
RAY_WAIT_S = 600  # nodes start their workers by hand or under srun: minutes, not hours
# The values only a script knows, in `role_flags`' lists: each is placed as the script's variable.
HEAD_ADDRESS, START_RANK, NODE_RANK = "HEAD_ADDRESS", "START_RANK", "NODE_RANK"

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
    "compressed-tensors": "compressed-tensors: a checkpoint llm-compressor wrote; vLLM reads its scheme from "
    "config.json's quantization_config (a released one's weights are priced at serve.dtype: lmspec does not "
    "read its scheme at compile time)",
}


def vllm_options(plan: Plan, pool: str | None = None) -> list[tuple[str, Any]]:
    """(vLLM option name, value) in file order; options left at vLLM's default are omitted, serve.extra_args
    come last. `pool` names a disaggregated pool (serve.disaggregation): its engine's own tp and dp on one
    node, and the KV connector in that pool's role."""
    v = plan.served().spec.serve
    tp, pp, dp = v.tp, v.pp, v.dp
    if pool is not None:  # one node per pool engine: no pipeline across nodes
        (tp, dp), pp = _pool_tp_dp(plan, pool), 1
    options: list[tuple[str, Any]] = [
        ("model", plan.served().model_dir),
        ("served-model-name", v.served_model_name),
        ("host", v.host),
        ("port", v.port),
        ("dtype", v.dtype),
        ("tensor-parallel-size", tp),
        ("pipeline-parallel-size", pp),
        ("data-parallel-size", dp),
        ("enable-expert-parallel", v.expert_parallel),
        ("enable-eplb", True if v.eplb is not None else None),
        ("eplb-config", dataclasses.asdict(v.eplb) if v.eplb is not None else None),
        ("all2all-backend", v.all2all_backend),
        ("max-model-len", v.max_model_len),
        ("gpu-memory-utilization", v.gpu_memory_utilization),
        ("max-num-seqs", v.max_num_seqs),
        ("max-num-batched-tokens", v.max_num_batched_tokens),
        yaml_entry("enable-prefix-caching", v.prefix_caching),
        ("speculative-config", speculative_config(plan)),
        ("kv-transfer-config", kv_transfer_config(plan, pool) if pool is not None else None),
        ("kv-cache-dtype", v.kv_cache_dtype),
        ("quantization", v.quantization),
        ("enforce-eager", v.enforce_eager),
        ("attention-backend", CPU_MLA_BACKEND if cpu_ranks(plan) and plan.spec.model.attention == "mla" else None),
    ]
    extra = [yaml_entry(name, value) for name, value in v.extra_args.items()]
    return [*((name, value) for name, value in options if value is not None), *extra]


def _pool_tp_dp(plan: Plan, pool: str) -> tuple[int, int]:
    d = plan.served().spec.serve.disaggregation
    assert d is not None, "only a disaggregated spec has pools"
    p = getattr(d, pool)
    return p.tp, p.dp


def speculative_config(plan: Plan) -> dict[str, Any] | None:
    """vLLM's --speculative-config of serve.speculative; acceptance_rate is lmspec's performance input, not vLLM's."""
    s = plan.served().spec.serve.speculative
    return None if s is None else {"method": s.method, "num_speculative_tokens": s.num_tokens}


def kv_transfer_config(plan: Plan, pool: str) -> dict[str, Any]:
    """vLLM's --kv-transfer-config of a pool: prefill engines produce the KV cache, decode engines consume it."""
    d = plan.served().spec.serve.disaggregation
    assert d is not None, "only a disaggregated spec has pools"
    return {"kv_connector": d.kv_connector, "kv_role": KV_ROLES[pool]}


def vllm_serve_args(plan: Plan) -> list[str]:
    """`vllm serve` arguments equal to vllm.yaml: the model positional, then each option as a
    flag, expanded the way vLLM expands a --config file (booleans as --x / --no-x)."""
    args: list[str] = []
    for name, value in vllm_options(plan):
        if name == "model":
            args.insert(0, str(value))
        else:
            args += config_words(name, value) or []
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


def role_flags(plan: Plan, role: RoleName, head_address: str, start_rank: str, node_rank: str) -> list[str] | None:
    """The flags a node role adds to `vllm serve --config vllm.yaml`, or None where the role runs no
    vLLM (a Ray worker only joins the cluster). `head_address`, `start_rank` and `node_rank` are what
    the script passes: its variables when emitting (HEAD_ADDRESS, START_RANK, NODE_RANK), real values
    in the tests."""
    v, layout = plan.served().spec.serve, plan.served().layout
    if role == "serve":
        return []
    if layout.mode == "mp":
        flags = [
            "--distributed-executor-backend",
            "mp",
            "--nnodes",
            str(layout.nodes),
            "--node-rank",
            "0" if role == "head" else node_rank,
            "--master-addr",
            head_address,
            "--master-port",
            str(v.master_port),
        ]
        # a worker node starts its ranks only: vLLM runs the executor's workers, no API server or engine core
        return flags if role == "head" else [*flags, "--headless"]
    if layout.mode == "ray":
        if role == "worker":
            return None
        # dp > 1 under Ray: vLLM places the data-parallel engines as Ray actors too
        return ["--distributed-executor-backend", "ray", *(["--data-parallel-backend", "ray"] if v.dp > 1 else [])]
    flags = [
        "--data-parallel-size-local",
        str(layout.dp_ranks_per_node),
        "--data-parallel-address",
        head_address,
        "--data-parallel-rpc-port",
        str(v.data_parallel_rpc_port),
    ]
    return flags if role == "head" else [*flags, "--headless", "--data-parallel-start-rank", start_rank]


def _script_words(flags: list[str]) -> list[Quoted]:
    """role_flags as shell words: the script's own variables expand, every other value is quoted."""
    return [Quoted(f'"${flag}"') if flag in (HEAD_ADDRESS, START_RANK, NODE_RANK) else shell(flag) for flag in flags]


def emit_serve(plan: Plan) -> dict[str, str]:
    scripts: dict[str, Callable[[Plan], str]] = {
        SERVE_SH: serve_sh,
        SERVE_HEAD_SH: functools.partial(node_sh, role="head"),
        SERVE_WORKER_SH: functools.partial(node_sh, role="worker"),
        SERVE_SBATCH_SH: serve_sbatch_sh,  # a launcher's own (its serve_files): the engine as one batch job
    }
    written = (*serve_scripts(plan.served().layout.nodes), *launcher_of(plan.spec.cluster).serve_files)
    return {VLLM_YAML: vllm_yaml(plan), **{rel: scripts[rel](plan) for rel in written}, **pool_files_of(plan)}


def pool_files_of(plan: Plan) -> dict[str, str]:
    """serve/prefill/ and serve/decode/ of a disaggregated deployment: each pool's vllm.yaml and the script
    that starts one of its engines; nothing without serve.disaggregation."""
    if plan.served().spec.serve.disaggregation is None:
        return {}
    files: dict[str, str] = {}
    for pool in SERVE_POOLS:
        config, script = pool_files(pool)
        files[config] = vllm_yaml(plan, pool)
        files[script] = serve_sh(plan, pool)
    return files


def vllm_yaml(plan: Plan, pool: str | None = None) -> str:
    config = VLLM_YAML if pool is None else pool_files(pool)[0]
    return render("vllm.yaml.j2", name=plan.name, config=config, options=vllm_options(plan, pool))


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


def _cli(plan: Plan) -> Quoted:
    return Quoted(f"${{{VLLM_CLI_ENV}:-{word(CPU_VLLM_CLI if cpu_ranks(plan) else 'vllm')}}}")


def serve_sh(plan: Plan, pool: str | None = None) -> str:
    """serve/serve.sh, or with `pool` serve/<pool>/serve.sh: one engine of that disaggregated pool."""
    v = plan.served().spec.serve
    return render(
        "serve.sh.j2",
        name=plan.name,
        script=SERVE_SH if pool is None else pool_files(pool)[1],
        pool_note=pool_note(plan, pool) if pool is not None else "",
        endpoint=endpoint(v.host, v.port),
        env=serve_env(plan),
        environment=site.environment_block(plan),
        api_key_env=v.api_key_env,
        api_key_line=api_key_line(plan),
        cli=_cli(plan),
        cpu_cli=CPU_VLLM_CLI,
        model=shell(plan.served().model_dir),
    )


def node_sh(plan: Plan, role: RoleName) -> str:
    """serve/head.sh (node 0) or serve/worker.sh (nodes 1..N-1) of a multi-node engine."""
    v, layout = plan.served().spec.serve, plan.served().layout
    flags = role_flags(plan, role, HEAD_ADDRESS, START_RANK, NODE_RANK)
    return render(
        f"serve_{role}.sh.j2",
        name=plan.name,
        role=role,
        mode=layout.mode,
        nodes=layout.nodes,
        endpoint=endpoint(v.host, v.port),
        env=serve_env(plan),
        environment=site.environment_block(plan),
        api_key_env=v.api_key_env,
        api_key_line=api_key_line(plan) if role == "head" else Quoted(f"unset {VLLM_API_KEY_ENV}"),
        cli=_cli(plan),
        cpu_cli=CPU_VLLM_CLI,
        model=shell(plan.served().model_dir),
        flags=_script_words(flags) if flags is not None else [],
        ray_port=v.ray_port,
        master_port=v.master_port,
        ray_gpus=0 if cpu_ranks(plan) else layout.gpus,
        ray_wait_env=word(RAY_WAIT_ENV),
        ray_wait_s=RAY_WAIT_S,
        python=Quoted(f"${{{word(PYTHON_ENV)}:-python3}}"),
        ray_wait=Quoted(f'"${{{word(RAY_WAIT_ENV)}:-{RAY_WAIT_S}}}"'),
        dp_ranks_per_node=layout.dp_ranks_per_node,
        nccl_env=shell(NCCL_ENV),
    )


def sbatch_options(plan: Plan) -> list[Quoted]:
    """`#SBATCH` options after job name, nodes and tasks, from cluster.slurm as launch/sbatch.sh reads
    them; a server neither checkpoints nor requeues, so no signal and no --requeue."""
    layout = plan.served().layout
    options = site.sbatch_options(plan, max(role.gpus_per_node for role in layout.roles))
    options += rack.segment_options(plan, layout.nodes)  # an engine spanning hosts stays in its NVLink domain
    return [*options, directive("--output=slurm-%x-%j.out"), directive("--open-mode=append")]


def serve_sbatch_sh(plan: Plan) -> str:
    layout = plan.served().layout
    return render(
        "serve_sbatch.sh.j2",
        name=plan.name,
        nodes=layout.nodes,
        options=sbatch_options(plan),
        multi_node=layout.nodes > 1,
        endpoint=endpoint(plan.served().spec.serve.host, plan.served().spec.serve.port),
        srun_words=site.srun_words(plan),
    )


def pool_note(plan: Plan, pool: str) -> str:
    """What one disaggregated pool's serve.sh is: the pool, its engines and its side of the KV transfer."""
    d = plan.served().spec.serve.disaggregation
    assert d is not None, "only a disaggregated spec has pools"
    p = getattr(d, pool)
    return (
        f"One engine of the {pool} pool ({p.engines} engine(s) of tp {p.tp} x dp {p.dp} GPUs, one per node): run it "
        f"on each of the pool's nodes. It is vLLM's {KV_ROLES[pool]} of {d.kv_connector}; a router sends each "
        "request to a prefill engine, then to a decode engine."
    )


def disaggregation_rows(plan: Plan) -> list[tuple[str, str]]:
    """REPORT.md's rows of serve.disaggregation: the pools and where the request router points."""
    v = plan.served().spec.serve
    d = v.disaggregation
    if d is None:
        return []
    pools = "; ".join(
        f"{pool}: {p.engines} x (tp {p.tp} x dp {p.dp}) GPUs, {KV_ROLES[pool]}, "
        f"`bash {pool_files(pool)[1]}` on each node"
        for pool, p in ((pool, getattr(d, pool)) for pool in SERVE_POOLS)
    )
    port = v.port
    return [
        (
            "disaggregated pools",
            f"{d.kv_connector} between {pools} (`lmspec run` starts serve/serve.sh: the one-engine deployment)",
        ),
        (
            "router",
            "vLLM 0.32 ships no prefill/decode router (its disaggregated-serving proxies are example scripts in "
            f"vLLM's repository): point one at every prefill node's http://NODE:{port} and every decode node's "
            f"http://NODE:{port} (serve.port); clients send requests to the router",
        ),
    ]


def serve_report_rows(plan: Plan) -> list[tuple[str, str]]:
    """REPORT.md's serving rows that are not memory: layout, lengths, dtypes, quantization, endpoint."""
    s, v = plan.spec, plan.served().spec.serve
    layout = f"tp {v.tp} x pp {v.pp} x dp {v.dp}" + (" with expert parallel" if v.expert_parallel else "")
    nodes = plan.served().layout
    spread = f" on {nodes.nodes} nodes ({nodes.mode.replace('_', ' ')})" if nodes.nodes > 1 else ""
    source = "serve.model_path" if v.model_path else "the conversion output"
    if v.model_path is None and plan.spec.quantize is not None:
        source = f"the quantize stage's {plan.spec.quantize.scheme} checkpoint, calibrated from the conversion output"
    auth = f"key from ${v.api_key_env}" if v.api_key_env else "no API key"
    return [
        ("engine layout", f"{layout} = {nodes.gpus} GPU(s){spread}"),
        (
            "max model len",
            f"{v.max_model_len:,} tokens"
            + (f" (training sequences: {s.train.seq_length:,})" if s.train is not None else ""),
        ),
        ("dtype / KV cache dtype", f"{v.dtype} / {v.kv_cache_dtype}"),
        ("quantization", QUANTIZATION_NOTES[v.quantization] if v.quantization else "none"),
        ("model served", f"`{plan.served().model_dir}` ({source})"),
        ("endpoint", f"{endpoint(v.host, v.port)} as `{v.served_model_name}`, {auth}"),
        ("run", launcher_of(plan.spec.cluster).serve_instructions(plan)),
        *disaggregation_rows(plan),
    ]
