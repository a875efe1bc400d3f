"""vLLM start-up errors: a KV cache too small for serve.max_model_len, and a serve.tp / serve.pp
that does not divide the attention heads or does not make up the world of processes.

Formats: vllm/v1/core/kv_cache_utils.py::check_enough_kv_cache_memory (``To serve at least one
request with the model's max seq len (131072), 52.66 GiB KV cache is needed, which is larger than the
available KV cache memory (23.37 GiB). Based on the available memory, the estimated maximum model
length is 58148.`` — older releases write ``models's`` and ``(52.66 GiB``; vllm/worker/worker.py of
the V0 engine: ``The model's max seq len (60000) is larger than the maximum number of tokens that can
be stored in KV cache (58384).``), ``No available memory for the cache blocks``, and vllm/config
(ModelConfig.verify_with_parallel_config): ``Total number of attention heads (32) must be divisible
by tensor parallel size (3).``; vllm/distributed/parallel_state.py (initialize_model_parallel): ``world_size
(8) is not equal to tensor_model_parallel_size (1) x pipeline_model_parallel_size (1).``, an engine in a world
of processes other than serve.tp x serve.pp (https://github.com/open-compass/VLMEvalKit/issues/561: under
``torchrun --nproc-per-node=8``).
"""

from __future__ import annotations

import re

from lmspec.compiler.observe.doctor.findings import Finding, Fix, LogText, Watch
from lmspec.compiler.observe.doctor.layout import BARE, VLLM_LOG, bare_divisibility
from lmspec.compiler.observe.logs.context import RunContext

_KV = re.compile(
    r"To serve at least one request with the models?'s? max seq len \((\d+)\), \(?([\d.]+) GiB KV cache "
    r"is needed, which is larger than the available KV cache memory \(([\d.]+) GiB\)"
    r"(?:\.\s*(?:Based on the available memory, the )?[Ee]stimated maximum model length is (\d+))?"
)
_KV_TOKENS = re.compile(
    r"max seq len \((\d+)\) is larger than the maximum number of tokens that can be stored in KV cache \((\d+)\)"
)
_NO_BLOCKS = re.compile(r"No available memory for the cache blocks")
_KERNEL_TILE = re.compile(r"Weight (\w+) = (\d+) is not divisible by (\w+) = (\d+)")
_HEADS = re.compile(r"Total number of attention heads \((\d+)\) must be divisible by tensor parallel size \((\d+)\)")
# vLLM's model-parallel groups (vllm/distributed/parallel_state.py, and SGLang's copy of it) need exactly tp x pp
# ranks, where Megatron's only need a multiple: ``is not equal to``, not ``is not divisible by``
_WORLD_NOT_TP_PP = re.compile(
    r"world_size`? \((\d+)\) is not equal to tensor_model_parallel_size \((\d+)\) x "
    r"pipeline_model_parallel_size \((\d+)\)"
)
MAX_GPU_MEMORY_UTILIZATION = 0.95  # above this vLLM's activations and CUDA graphs have no headroom
_LEN_QUANTUM_TOKENS = 256


def _fitting(tokens: int) -> int:
    """A max_model_len that fits in `tokens`, rounded down to a multiple of _LEN_QUANTUM_TOKENS."""
    return tokens // _LEN_QUANTUM_TOKENS * _LEN_QUANTUM_TOKENS or tokens


def _more_memory_fixes(context: RunContext | None) -> list[Fix]:
    """What leaves more KV cache at the same length, without the numbers vLLM's newer message gives."""
    serve = context.spec.serve if context is not None else None
    if serve is not None and serve.gpu_memory_utilization >= MAX_GPU_MEMORY_UTILIZATION:
        return [Fix("serve.kv_cache_dtype", "fp8", "halves KV bytes per token")]
    now = f" (now {serve.gpu_memory_utilization:g})" if serve is not None else ""
    return [
        Fix("serve.gpu_memory_utilization", f"<higher, at most {MAX_GPU_MEMORY_UTILIZATION}>", f"more memory{now}"),
        Fix("serve.kv_cache_dtype", "fp8", "halves KV bytes per token"),
    ]


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


class VllmKvCacheTooSmall:
    name = "vllm_kv_cache"
    watches = (
        Watch(_KV, (b"To serve at least one request with the model",)),
        Watch(_KV_TOKENS, (b"is larger than the maximum number of tokens that can be stored in KV cache",)),
        Watch(_NO_BLOCKS, (b"No available memory for the cache blocks",)),
    )

    def detect(self, log: LogText, context: RunContext | None) -> Finding | None:
        hits = log.find(_KV)
        if not hits and (tokens := log.find(_KV_TOKENS)):
            asked, stored = int(tokens[0][1].group(1)), int(tokens[0][1].group(2))
            return Finding(
                self.name,
                "vLLM KV cache too small for max_model_len",
                f"One sequence of max_model_len={asked} needs more KV cache than is left after the weights "
                f"and activations within gpu_memory_utilization: it holds {stored} tokens.",
                tuple(e for e, _ in tokens),
                (
                    Fix("serve.max_model_len", str(_fitting(stored)), f"the KV cache holds {stored} tokens"),
                    *_more_memory_fixes(context),
                ),
            )
        if not hits:
            if not (blocks := log.find(_NO_BLOCKS)):
                return None
            return Finding(
                self.name,
                "vLLM has no memory left for the KV cache",
                "The weights (and activation profile) fill gpu_memory_utilization of the GPU.",
                tuple(e for e, _ in blocks),
                (
                    Fix("serve.gpu_memory_utilization", str(MAX_GPU_MEMORY_UTILIZATION), "more room"),
                    Fix("serve.tp", "<double>", "weights split over more GPUs"),
                ),
            )
        m = hits[0][1]
        max_len, needed, available = int(m.group(1)), float(m.group(2)), float(m.group(3))
        cause = (
            f"One sequence of max_model_len={max_len} needs {needed:g} GiB of KV cache; only {available:g} GiB "
            "is left after the weights and activations within gpu_memory_utilization."
        )
        fixes = []
        if m.group(4):
            fixes.append(
                Fix(
                    "serve.max_model_len",
                    str(_fitting(int(m.group(4)))),
                    f"vLLM's own estimate of what fits: {m.group(4)}",
                )
            )
        if context is not None and context.spec.serve is not None:
            serve, gpu_gib = context.spec.serve, context.spec.hardware.gpu.memory_gib
            wanted = serve.gpu_memory_utilization + (needed - available) / gpu_gib
            if wanted <= MAX_GPU_MEMORY_UTILIZATION:
                fixes.append(
                    Fix(
                        "serve.gpu_memory_utilization",
                        f"{wanted + 0.005:.2f}",
                        f"from {serve.gpu_memory_utilization:g}: +{needed - available:.2f} GiB on a "
                        f"{gpu_gib:g} GiB GPU",
                    )
                )
            if serve.kv_cache_dtype == "auto":
                fixes.append(Fix("serve.kv_cache_dtype", "fp8", "halves KV bytes per token"))
            heads, per_node = context.spec.model.num_attention_heads, context.spec.hardware.gpus_per_node
            if heads % (serve.tp * 2) == 0 and serve.tp * 2 <= per_node:
                fixes.append(Fix("serve.tp", str(serve.tp * 2), f"from {serve.tp}: weights and KV heads split further"))
            else:
                fixes.append(
                    Fix(
                        "serve.pp",
                        str(serve.pp * 2),
                        f"from {serve.pp}: layers (and their KV cache) split over more GPUs; "
                        f"serve.tp={serve.tp * 2} would leave the node or not divide {heads} heads",
                    )
                )
        else:
            fixes += _more_memory_fixes(None)
        return Finding(
            self.name, "vLLM KV cache too small for max_model_len", cause, tuple(e for e, _ in hits), tuple(fixes)
        )


class VllmParallelNotDividing:
    name = "vllm_parallel"
    watches = (
        Watch(_HEADS, (b"Total number of attention heads (",)),
        Watch(_WORLD_NOT_TP_PP, (b") is not equal to tensor_model_parallel_size (",)),
        Watch(_KERNEL_TILE, (b" is not divisible by ",)),
        BARE,
        VLLM_LOG,
    )

    def detect(self, log: LogText, context: RunContext | None) -> Finding | None:
        tp = context.spec.serve.tp if context is not None and context.spec.serve is not None else None
        if hits := log.find(_KERNEL_TILE, limit=2):
            name, size, tile_name, tile = hits[0][1].groups()
            return Finding(
                self.name,
                "serve.tp splits a weight finer than the kernel's tile",
                f"Each tensor-parallel rank holds {size} of the weight's {name}, which is not a multiple of the "
                f"quantized kernel's {tile_name} ({tile}): fewer ranks give each a larger, divisible slice.",
                tuple(e for e, _ in hits),
                (
                    Fix(
                        "serve.tp",
                        str(tp // 2) if tp and tp > 1 else "<smaller>",
                        f"the per-rank slice must be a multiple of {tile}",
                    ),
                ),
            )
        if (bare := bare_divisibility(log)) and log.find(VLLM_LOG.pattern, 1):
            hits, size, parts = bare
            fitting = [d for d in _divisors(size) if d <= parts]
            return Finding(
                self.name,
                "serve.tp does not divide the model",
                f"vLLM splits {size} (attention or KV heads, experts, as the traceback shows) evenly over "
                f"{parts} tensor-parallel ranks; {parts} does not divide {size}.",
                tuple(e for e, _ in hits),
                (Fix("serve.tp", str(max(fitting)), f"divisors of {size}: {', '.join(map(str, fitting))}"),),
            )
        if hits := log.find(_WORLD_NOT_TP_PP):
            world, tp, pp = (int(g) for g in hits[0][1].groups())
            fixes = [
                Fix(
                    "serve.tp",
                    str(world // pp) if world % pp == 0 else f"<{world} / serve.pp>",
                    f"tp x pp must equal the {world} processes started; or start one engine process (vLLM "
                    "starts its own workers), not one per GPU under torchrun or mpirun",
                )
            ]
            if pp > 1 and world % tp == 0:
                fixes.append(Fix("serve.pp", str(world // tp), f"or keep tp {tp}: pp x tp must equal {world}"))
            return Finding(
                self.name,
                "serve.tp x serve.pp is not the number of processes",
                f"vLLM's engine was started in a world of {world} processes but builds its groups for tp {tp} x "
                f"pp {pp} = {tp * pp}: a launcher (torchrun, mpirun, Slurm) started one engine per GPU, or "
                "WORLD_SIZE was left set in the environment.",
                tuple(e for e, _ in hits),
                tuple(fixes),
            )
        if hits := log.find(_HEADS):
            heads, tp = int(hits[0][1].group(1)), int(hits[0][1].group(2))
            fitting = [d for d in _divisors(heads) if d <= max(tp, 8)]
            return Finding(
                self.name,
                "serve.tp does not divide the attention heads",
                f"vLLM splits the {heads} attention heads evenly over tensor-parallel ranks; {tp} "
                f"does not divide {heads}.",
                tuple(e for e, _ in hits),
                (
                    Fix(
                        "serve.tp",
                        str(max(d for d in fitting if d <= tp)),
                        f"divisors of {heads}: {', '.join(map(str, fitting))}",
                    ),
                ),
            )
        return None
