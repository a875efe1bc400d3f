"""Serving's budget: vLLM must hold at least one `serve.max_model_len` sequence in the KV cache
left after the weights. Each fix is computed on a copy of the spec and shown with its result. A
train+serve spec's hardware is sized for training: its fixes name serve keys and `serve=null`, never
hardware; a serve-only spec's hardware is the engine's, so a longer pipeline may bring more nodes.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from lmspec.compiler.errors import Problem, error
from lmspec.compiler.models.dims import divisors, domain_gpus_of, world_size
from lmspec.compiler.models.serve_layout import engine_gpus, engine_nodes
from lmspec.compiler.models.serve_memory import estimate_serve_memory
from lmspec.compiler.models.units import gib
from lmspec.compiler.rules.budget import both, computable, shown_changes, with_value, with_values
from lmspec.compiler.rules.context import ServingContext
from lmspec.compiler.rules.serving import TRAIN_ONLY_FIX
from lmspec.compiler.spec.sections import ServingSpec


def _serve_fixes(spec: ServingSpec) -> list[str]:
    s = spec.serve
    candidates: list[dict[str, Any]] = []
    if s.gpu_memory_utilization < 0.95:
        candidates.append({"serve.gpu_memory_utilization": 0.95})
    if not s.kv_cache_dtype.startswith("fp8"):
        candidates.append({"serve.kv_cache_dtype": "fp8"})
    if s.quantization is None:
        candidates.append({"serve.quantization": "fp8"})
    heads = spec.model.num_attention_heads
    tp = next((n for n in divisors(heads) if n > s.tp and n <= domain_gpus_of(spec.hardware)), None)
    if tp is not None:
        candidates.append({"serve.tp": tp})
    gpus = world_size(spec.hardware.gpus_per_node, spec.hardware.nodes)
    for pp in range(s.pp + 1, spec.model.num_layers + 1):
        longer = with_value(spec, "serve.pp", pp)
        if estimate_serve_memory(longer).max_tokens_in_cache < s.max_model_len:
            continue
        if engine_gpus(longer) <= gpus:
            candidates.append({"serve.pp": pp})
        elif spec.train is None:  # serve-only: the engine's own hardware grows with it
            candidates.append({"serve.pp": pp, "hardware.nodes": engine_nodes(longer)})
        break
    lines = []
    now = estimate_serve_memory(spec).max_tokens_in_cache
    for changes in candidates:
        after = estimate_serve_memory(with_values(spec, changes))
        if after.max_tokens_in_cache <= now:
            continue
        verdict = "fits" if after.max_tokens_in_cache >= s.max_model_len else "still short"
        lines.append(f"{shown_changes(changes)} -> {after.max_tokens_in_cache:,} tokens ({verdict})")
    if spec.train is not None:
        lines.append(TRAIN_ONLY_FIX)
    return lines


def serving_fits_memory(ctx: ServingContext) -> Iterator[Problem]:
    spec = ctx.spec
    if not computable(spec):
        return
    est = estimate_serve_memory(spec)
    if est.max_tokens_in_cache >= spec.serve.max_model_len:
        return
    s = spec.serve
    fixes = _serve_fixes(spec)
    if est.max_tokens_in_cache:
        longest = f"the longest that fits is serve.max_model_len={est.max_tokens_in_cache}"
    else:
        longest = "no sequence fits: the weights and activation reserve leave nothing for the KV cache"
    yield error(
        "serve.max_model_len",
        (
            f"serving does not fit: {ctx.show('serve.max_model_len')} "
            f"needs {both(s.max_model_len * est.kv_cache_bytes_per_token)} "
            f"of KV cache per GPU ({est.kv_cache_bytes_per_token:,} bytes/token), but "
            f"{ctx.show('serve.gpu_memory_utilization')} x {ctx.show('hardware.gpu.memory_gib')} minus weights "
            f"{both(est.weights_bytes_per_gpu)} per GPU ({ctx.show('serve.tp')}, "
            f"{ctx.show('serve.pp')}) and an activation "
            f"reserve of {gib(est.activation_reserve_bytes)} leaves {gib(est.cache_budget_bytes)}; {longest}. Fixes: "
            + ("; ".join(fixes) if fixes else "serve a smaller model or use GPUs with more memory")
        ),
    )


RULES = (serving_fits_memory,)
