"""Rules of serving with vLLM: the layout fits the model and the GPUs, the lengths fit the
model and the training run, the quantization fits the checkpoint.

Whether one max_model_len sequence fits the KV cache left after the weights is a memory
question: it lives with the serving memory model (lmspec.compiler.models), not here.
"""

from __future__ import annotations

from collections.abc import Iterator

from lmspec.compiler.endpoint import loopback
from lmspec.compiler.errors import Problem, error, warning
from lmspec.compiler.models.dims import device_kind, divisors, domain_gpus_of, world_size
from lmspec.compiler.models.serve_layout import engine_gpus, engine_nodes, mp_applies
from lmspec.compiler.models.serve_length import vllm_max_model_len
from lmspec.compiler.rules.context import ServingContext, listed
from lmspec.compiler.vllm_cpu import cpu_attention_problems

# Above this fraction vLLM leaves too little device memory for the CUDA context, NCCL buffers
# and the sampler's peaks (the seed's pitfall); vLLM's own default is 0.9.
GPU_MEMORY_UTILIZATION_WARN = 0.95
CALIBRATED_QUANTIZATION = ("awq", "gptq")  # scales come from a calibration run, not from vLLM
_SERVE_GPU_KEYS = ("serve.tp", "serve.pp", "serve.dp", "hardware.nodes")
# The way out for a train+serve spec whose serving outgrows the hardware its training was sized for.
TRAIN_ONLY_FIX = "serve=null (a train-only job: the hardware is sized for training; serve in a spec of its own)"


def serve_tp_divides_heads(ctx: ServingContext) -> Iterator[Problem]:
    heads, tp = ctx.spec.model.num_attention_heads, ctx.spec.serve.tp
    if heads % tp:
        yield error(
            "serve.tp",
            (
                f"{ctx.show('serve.tp')} does not divide {ctx.show('model.num_attention_heads')}; "
                f"valid: {listed(divisors(heads))}"
            ),
        )


def serve_tp_fits_kv_heads(ctx: ServingContext) -> Iterator[Problem]:
    """vLLM splits kv heads over TP ranks, or replicates them when TP exceeds them; both even."""
    m, tp = ctx.spec.model, ctx.spec.serve.tp
    if m.attention == "gqa" and m.num_kv_heads % tp and tp % m.num_kv_heads:
        valid = [d for d in divisors(m.num_attention_heads) if m.num_kv_heads % d == 0 or d % m.num_kv_heads == 0]
        yield error(
            "serve.tp",
            (
                f"{ctx.show('serve.tp')} neither divides nor is a multiple of {ctx.show('model.num_kv_heads')}: "
                f"vLLM cannot split or replicate the key/value heads evenly; valid: {listed(valid)}"
            ),
        )


def more_hardware_fix(ctx: ServingContext, nodes: int) -> str:
    """The fix for a serving engine larger than the hardware: a serve-only spec's hardware is the
    engine's, so more nodes; a train+serve spec's is sized for training, so serve keys or no serving."""
    if ctx.spec.train is None:
        return f"hardware.nodes={nodes}"
    return TRAIN_ONLY_FIX


def serve_fits_gpus(ctx: ServingContext) -> Iterator[Problem]:
    v = ctx.spec.serve
    gpus = world_size(ctx.spec.hardware.gpus_per_node, ctx.spec.hardware.nodes)
    used = engine_gpus(ctx.spec)
    if used > gpus:
        yield error(
            "serve.tp",
            (
                f"serving needs {ctx.factor('serve.tp')} x {ctx.factor('serve.pp')} x {ctx.factor('serve.dp')} = "
                f"{used} GPUs but {ctx.factor('hardware.gpus_per_node')} x {ctx.factor('hardware.nodes')} = {gpus} "
                f"are available ({ctx.sources(*_SERVE_GPU_KEYS)}); "
                f"lower serve.tp/pp/dp (serve.quantization=fp8 or serve.kv_cache_dtype=fp8 need fewer GPUs), "
                f"or {more_hardware_fix(ctx, engine_nodes(ctx.spec))}"
            ),
        )
    elif v.tp > domain_gpus_of(ctx.spec.hardware):
        domain = domain_gpus_of(ctx.spec.hardware)
        where, across = (
            (ctx.show("hardware.gpus_per_node"), "nodes")
            if domain == ctx.spec.hardware.gpus_per_node
            else (f"the {domain} GPUs of the NVLink domain it fills ({ctx.show('hardware.nvlink_domain')})", "domains")
        )
        yield warning(
            "serve.tp",
            (
                f"{ctx.show('serve.tp')} exceeds {where}: every layer's all-reduce crosses the inter-node network; "
                f"use serve.tp={max(d for d in divisors(ctx.spec.model.num_attention_heads) if d <= domain)} "
                f"with serve.pp across {across}"
            ),
        )


def serve_pp_fits_layers(ctx: ServingContext) -> Iterator[Problem]:
    if ctx.spec.serve.pp > ctx.spec.model.num_layers:
        yield error(
            "serve.pp",
            (
                f"{ctx.show('serve.pp')} exceeds {ctx.show('model.num_layers')}: a pipeline stage would hold "
                f"no layer; use serve.pp<={ctx.spec.model.num_layers}"
            ),
        )


def serve_len_within_positions(ctx: ServingContext) -> Iterator[Problem]:
    s = ctx.spec
    longest = vllm_max_model_len(s.model)
    if s.serve.max_model_len > longest:
        rope = s.model.rope_scaling
        scaled = (
            f" x rope_scaling factor {rope.factor:g} ({rope.type})"
            if longest != s.model.max_position_embeddings and rope
            else ""
        )
        yield error(
            "serve.max_model_len",
            (
                f"{ctx.show('serve.max_model_len')} exceeds the {longest:,} tokens vLLM derives from the model "
                f"({ctx.show('model.max_position_embeddings')}{scaled}); vLLM refuses a longer --max-model-len; "
                f"use serve.max_model_len<={longest}"
            ),
        )
    elif s.train is not None and s.serve.max_model_len < s.train.seq_length:
        yield warning(
            "serve.max_model_len",
            (
                f"{ctx.show('serve.max_model_len')} is shorter than {ctx.show('train.seq_length')}: "
                "requests as long as the training sequences will be rejected; "
                f"serve.max_model_len={s.train.seq_length} serves them"
            ),
        )


def serve_memory_utilization_leaves_headroom(ctx: ServingContext) -> Iterator[Problem]:
    # (0, 1] itself is the schema's bound; this is the headroom vLLM does not manage.
    if device_kind(ctx.spec) == "gpu" and ctx.spec.serve.gpu_memory_utilization > GPU_MEMORY_UTILIZATION_WARN:
        yield warning(
            "serve.gpu_memory_utilization",
            (
                f"{ctx.show('serve.gpu_memory_utilization')} leaves under {1 - GPU_MEMORY_UTILIZATION_WARN:.0%} "
                "of each GPU for the CUDA context, NCCL buffers and sampling peaks; start-up or the first "
                "large batch may run out of memory; 0.9 is vLLM's default"
            ),
        )


def serve_quantization_has_checkpoint(ctx: ServingContext) -> Iterator[Problem]:
    v = ctx.spec.serve
    if v.quantization in CALIBRATED_QUANTIZATION and v.model_path is None:
        yield error(
            "serve.quantization",
            (
                f"{ctx.show('serve.quantization')} needs a checkpoint calibrated for {v.quantization.upper()}, "
                f"but the model served is the conversion output ({ctx.show('convert.output')}), unquantized "
                f"{ctx.value('convert.dtype')}; calibrate it and set serve.model_path to the quantized directory, "
                "or use serve.quantization=fp8 (quantized by vLLM on load)"
            ),
        )


def serve_expert_parallel_needs_moe(ctx: ServingContext) -> Iterator[Problem]:
    if ctx.spec.serve.expert_parallel and ctx.spec.model.moe is None:
        yield error(
            "serve.expert_parallel",
            (
                f"{ctx.show('serve.expert_parallel')} needs a MoE model ({ctx.show('model.moe')}); "
                "set serve.expert_parallel=false"
            ),
        )


def serve_cpu_kvcache_whole_gib(ctx: ServingContext) -> Iterator[Problem]:
    space = ctx.spec.serve.cpu_kvcache_space_gib
    if device_kind(ctx.spec) == "cpu" and space != int(space):
        yield error(
            "serve.cpu_kvcache_space_gib",
            (
                f"{ctx.show('serve.cpu_kvcache_space_gib')} is not a whole number: vLLM reads "
                f"VLLM_CPU_KVCACHE_SPACE as an integer of GiB; use serve.cpu_kvcache_space_gib={max(1, round(space))}"
            ),
        )


def serve_multi_node_host_reachable(ctx: ServingContext) -> Iterator[Problem]:
    nodes = engine_nodes(ctx.spec)
    if nodes > 1 and loopback(ctx.spec.serve.host):
        yield error(
            "serve.host",
            (
                f"{ctx.show('serve.host')} is a loopback address, but the engine spans {nodes} nodes: the other "
                "nodes and the clients cannot reach node 0's API there; use serve.host=0.0.0.0 (or node 0's address)"
            ),
        )


def serve_data_parallel_applies(ctx: ServingContext) -> Iterator[Problem]:
    """serve.multi_node=data_parallel needs whole data-parallel ranks on every node, the same number each
    (lmspec.compiler.models.serve_layout.data_parallel_applies); say which part fails."""
    v, per_node = ctx.spec.serve, ctx.spec.hardware.gpus_per_node
    if v.multi_node != "data_parallel" or engine_nodes(ctx.spec) == 1:
        return
    rank = v.tp * v.pp
    if rank > per_node:
        why = f"a data-parallel rank's serve.tp x serve.pp = {rank} GPUs exceeds a node's {per_node}"
        fix = "serve.multi_node=ray (tensor/pipeline parallel across nodes)"
    elif per_node % rank:
        why = f"a data-parallel rank's serve.tp x serve.pp = {rank} GPUs does not divide a node's {per_node}"
        fix = "serve.multi_node=ray, or serve.tp/pp whose product divides hardware.gpus_per_node"
    elif v.dp % (per_node // rank):
        local = per_node // rank
        whole = sorted({max(local, v.dp // local * local), -(-v.dp // local) * local})
        why = f"{ctx.show('serve.dp')} is not a multiple of the {local} ranks a node holds: nodes would differ"
        fix = " or ".join(f"serve.dp={dp}" for dp in whole) + ", or serve.multi_node=ray"
    else:
        return
    yield error("serve.multi_node", f"{ctx.show('serve.multi_node')} does not apply: {why}; use {fix}")


def serve_mp_applies(ctx: ServingContext) -> Iterator[Problem]:
    """serve.multi_node=mp runs one engine whose ranks split evenly over its nodes
    (lmspec.compiler.models.serve_layout.mp_applies); say which part fails."""
    v = ctx.spec.serve
    nodes = engine_nodes(ctx.spec)
    if v.multi_node != "mp" or nodes == 1 or mp_applies(ctx.spec):
        return
    if v.dp > 1:
        why = (
            f"{ctx.show('serve.dp')}: lmspec runs one engine per `vllm serve --nnodes` deployment "
            "(replicas are separate deployments)"
        )
        fix = "serve.dp=1 (serve.replicas for copies), or serve.multi_node=ray, or serve.multi_node=data_parallel"
    else:
        gpus = engine_gpus(ctx.spec)
        why = (
            f"vLLM needs --nnodes {nodes} to divide the world size serve.tp x serve.pp = {v.tp} x {v.pp} = {gpus} "
            "(the same number of ranks on every node)"
        )
        fix = f"serve.tp/pp whose product {nodes} divides, or serve.multi_node=ray (its last node may hold fewer)"
    yield error("serve.multi_node", f"{ctx.show('serve.multi_node')} does not apply: {why}; use {fix}")


def serve_cpu_attention_supported(ctx: ServingContext) -> Iterator[Problem]:
    """What vLLM's CPU backend cannot serve (compiler/vllm_cpu.py, which the serve stage runs again)."""
    yield from cpu_attention_problems(ctx.spec, ctx.origins)


RULES = (
    serve_tp_divides_heads,
    serve_tp_fits_kv_heads,
    serve_fits_gpus,
    serve_pp_fits_layers,
    serve_len_within_positions,
    serve_memory_utilization_leaves_headroom,
    serve_quantization_has_checkpoint,
    serve_expert_parallel_needs_moe,
    serve_cpu_kvcache_whole_gib,
    serve_multi_node_host_reachable,
    serve_data_parallel_applies,
    serve_mp_applies,
    serve_cpu_attention_supported,
)
