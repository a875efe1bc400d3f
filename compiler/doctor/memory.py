"""CUDA out of memory, mapped to the cheapest spec changes in the memory budget rule's order:
lower micro batch, recompute, shard optimizer/gradients (ZeRO / distributed optimizer), add PP.

Formats: c10/cuda/CUDACachingAllocator.cpp (``CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0
has a total capacity of 79.11 GiB of which 1.23 GiB is free. ...``; before torch 2.1 ``(GPU 0;
79.35 GiB total capacity; ...)``) and the CUDA runtime's ``CUDA error: out of memory``.
"""

from __future__ import annotations

import re
from typing import Any

from compiler.doctor.findings import Finding, Fix, LogText
from compiler.logs.context import RunContext

_OOM = re.compile(r"CUDA out of memory\. Tried to allocate ([\d.]+ [KMGT]?i?B)"
                  r"(?:\. GPU (\d+) has a total capacity of ([\d.]+ [KMGT]?i?B) of which ([\d.]+ [KMGT]?i?B) is free"
                  r"|\s*\(GPU (\d+); ([\d.]+ [KMGT]?i?B) total capacity)?")
_OOM_OTHER = re.compile(r"CUDA error: out of memory|torch\.(?:cuda\.)?OutOfMemoryError")
_GIB_BYTES = 1024**3
_NEXT_RECOMPUTE = {"none": "selective", "selective": "full"}


def _memory_numbers(derived: dict[str, Any]) -> str | None:
    """The Plan's own per-GPU estimate, when the build carries one (plan.json `memory`)."""
    memory = derived.get("memory")
    if not isinstance(memory, dict):
        return None
    total, budget = memory.get("total_bytes"), memory.get("budget_bytes")
    if not isinstance(total, (int, float)) or not isinstance(budget, (int, float)):
        return None
    return (f"The Plan estimates {total / _GIB_BYTES:.1f} GiB per GPU on the worst stage against a "
            f"{budget / _GIB_BYTES:.1f} GiB budget.")


def oom_fixes(context: RunContext | None) -> list[Fix]:
    """The fix list in the seed's order, with values from the spec when it is known."""
    if context is None:
        return [Fix("train.micro_batch_size", "<half of now>", "activations scale with it; global batch is "
                    "kept by more gradient accumulation"),
                Fix("train.recompute", "selective (or full)", "recompute attention/all activations in backward"),
                Fix("parallel.zero_stage", "<one higher> (deepspeed)", "shard optimizer states, then gradients, "
                    "then weights over data parallel"),
                Fix("parallel.distributed_optimizer", "true (megatron)", "shard optimizer states over data parallel"),
                Fix("parallel.pp", "<double>", "fewer layers, hence weights and activations, per GPU")]
    spec = context.spec
    fixes = []
    if spec.train.micro_batch_size > 1:
        fixes.append(Fix("train.micro_batch_size", str(spec.train.micro_batch_size // 2),
                         f"from {spec.train.micro_batch_size}: halves activations; global batch "
                         f"{spec.train.global_batch_size} kept by more accumulation"))
    if spec.train.recompute in _NEXT_RECOMPUTE:
        fixes.append(Fix("train.recompute", _NEXT_RECOMPUTE[spec.train.recompute],
                         f"from {spec.train.recompute}: stores fewer activations, costs extra forward work"))
    if spec.train.backend == "deepspeed" and spec.parallel.zero_stage < 3:
        fixes.append(Fix("parallel.zero_stage", str(spec.parallel.zero_stage + 1),
                         f"from {spec.parallel.zero_stage}: shards more model state over data parallel"))
    if spec.train.backend == "megatron" and not spec.parallel.distributed_optimizer:
        fixes.append(Fix("parallel.distributed_optimizer", "true", "shards optimizer states over data parallel"))
    layers = spec.model.num_layers
    if spec.parallel.pp * 2 <= layers:
        fixes.append(Fix("parallel.pp", str(spec.parallel.pp * 2),
                         f"from {spec.parallel.pp}: half the layers per GPU (needs enough GPUs or lower dp)"))
    return fixes


class CudaOutOfMemory:
    name = "cuda_oom"

    def detect(self, log: LogText, context: RunContext | None) -> Finding | None:
        hits = log.find(_OOM) or log.find(_OOM_OTHER)
        if not hits:
            return None
        match = hits[0][1]
        cause = "A GPU ran out of memory"
        if match.re is _OOM:
            cause += f" allocating {match.group(1)}"
            capacity, free = match.group(3) or match.group(6), match.group(4)
            if capacity:
                cause += f" (GPU {match.group(2) or match.group(5)}: {capacity} total"
                cause += f", {free} free)" if free else ")"
        cause += (". Activations peak in the first backward of the first pipeline stage; weights, gradients "
                  "and optimizer states are fixed per layout.")
        if context is not None and (numbers := _memory_numbers(context.derived)):
            cause += " " + numbers
        return Finding(self.name, "CUDA out of memory", cause, tuple(e for e, _ in hits),
                       tuple(oom_fixes(context)))
