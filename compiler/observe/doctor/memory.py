"""GPU out of memory (CUDA on NVIDIA, HIP on AMD), mapped to the memory budget rule's fixes
(compiler/rules/budget.py, in the seed's order: lower micro batch, recompute, shard state, add PP/EP), each with
the memory model's number for the worst GPU, scaled by how far the real run overshot the model's estimate.

Formats: c10/cuda/CUDACachingAllocator.cpp (``CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0
has a total capacity of 79.11 GiB of which 1.23 GiB is free. Including non-PyTorch memory, this process
has 77.87 GiB memory in use. ...``; before torch 2.1 ``(GPU 0; 79.35 GiB total capacity; ...)``) and
the CUDA runtime's ``CUDA error: out of memory`` (torch before 0.4: ``THCudaCheck FAIL file=...
error=2 : out of memory``). torch on ROCm prints the same allocator message hipified (``HIP out of memory.
Tried to allocate 1.88 GiB. GPU 0 has a total capacity of 23.98 GiB of which 1.70 GiB is free. Of the
allocated memory ...``, mostly without the per-process line), and the HIP runtime's ``HIP error: out of
memory`` / ``hipErrorOutOfMemory``: the same signature, named for the API (cuda_oom, hip_oom).

An OOM whose traceback runs through building or loading the model (``in get_model``, ``in cuda``,
``in load_model``) and through no training step happens before any activation exists: a smaller
micro batch or recompute cannot help there, only spreading the weights can.
"""

from __future__ import annotations

import re

from lmspec.compiler.models.units import gib
from lmspec.compiler.observe.doctor.findings import Finding, Fix, LogText, Watch
from lmspec.compiler.observe.logs.context import RunContext
from lmspec.compiler.spec.override_text import override_value

_SIZE = r"[\d.]+ [KMGT]?i?B"


def _allocator_oom(api: str) -> re.Pattern[str]:
    """torch's caching allocator message, CUDA's or its hipified twin."""
    return re.compile(
        rf"{api} out of memory\. Tried to allocate ({_SIZE})"
        rf"(?:\. GPU (\d+) has a total capacity of ({_SIZE}) of which ({_SIZE}) is free"
        rf"|\s*\(GPU (\d+); ({_SIZE}) total capacity)?"
    )


_IN_USE = re.compile(rf"this process has ({_SIZE}) memory in use")
_OTHER_PROCESS = re.compile(rf"Process (\d+) has ({_SIZE}) memory in use")
# torch.OutOfMemoryError names no API itself: a ROCm build's says HIP right after it
_CUDA_OTHER = re.compile(
    r"CUDA error: out of memory|torch\.(?:cuda\.)?OutOfMemoryError(?!: HIP)|THCudaCheck FAIL .*: out of memory"
)
_HIP_OTHER = re.compile(r"HIP error: out of memory|hipErrorOutOfMemory")
_FRAME = r'^\s*File "[^"]+", line \d+, in '
_BUILD_FRAME = re.compile(
    _FRAME + r"(?:get_model|setup_model_and_optimizer|model_provider|build_model|cuda|_apply|load_model|"
    r"load_weights|from_pretrained|_load_state_dict_into_meta_model|load_state_dict|init_device)$"
)
_STEP_FRAME = re.compile(
    _FRAME + r"(?:train|train_step|training_step|forward_backward\w*|forward_step|backward|step|execute_model)$"
)
# a micro batch and recompute shape activations, which do not exist while the model is being built
_ACTIVATION_KEYS = ("train.micro_batch_size", "train.recompute")
_UNIT_BYTES = {
    "B": 1,
    "KiB": 1024,
    "MiB": 1024**2,
    "GiB": 1024**3,
    "TiB": 1024**4,
    "KB": 1024,
    "MB": 1024**2,
    "GB": 1024**3,
    "TB": 1024**4,
}  # torch's format_size is binary


def size_bytes(text: str) -> int:
    number, unit = text.split()
    return int(float(number) * _UNIT_BYTES[unit])


def generic_fixes() -> list[Fix]:
    """Without a build: the fix list in the seed's order, as directions."""
    return [
        Fix(
            "train.micro_batch_size",
            "<half of now>",
            "activations scale with it; global batch is kept by more gradient accumulation",
        ),
        Fix("train.recompute", "selective (or full)", "recompute attention/all activations in backward"),
        Fix(
            "parallel.zero_stage",
            "<one higher> (deepspeed)",
            "shard optimizer states, then gradients, then weights over data parallel",
        ),
        Fix("parallel.distributed_optimizer", "true (megatron)", "shard optimizer states over data parallel"),
        Fix("parallel.pp", "<double>", "fewer layers, hence weights and activations, per GPU"),
    ]


def planned_fixes(context: RunContext, needed_bytes: int | None) -> tuple[str, list[Fix]]:
    """The budget rule's candidate fixes for this build, each with its estimated worst GPU.

    The run needed `needed_bytes` (in use + the failed allocation) where the model planned less;
    each estimate is scaled by that ratio so a fix that only just fits on paper is not offered as enough.
    """
    from lmspec.compiler.rules.budget import candidate_fixes, estimate, with_values

    spec = context.training
    planned = estimate(spec)
    if planned is None:
        return "", generic_fixes()
    worst, budget = planned.worst.total_bytes, planned.budget_bytes
    scale = max(1.0, needed_bytes / worst) if needed_bytes else 1.0
    note = f" The memory model planned {gib(worst)} per GPU on the worst stage of {gib(budget)} usable" + (
        f"; the run needed at least {gib(needed_bytes)}, x{scale:.2f} the estimate." if needed_bytes else "."
    )
    fixes = []
    for changes in candidate_fixes(spec):
        memory = estimate(with_values(spec, changes))
        if memory is None:
            continue
        (key, value), *rest = changes.items()
        projected = memory.worst.total_bytes * scale
        verdict = "fits" if projected <= budget else "still over"
        also = f"with {' '.join(f'{k}={override_value(v)}' for k, v in rest)}: " if rest else ""
        fixes.append(
            Fix(
                key,
                override_value(value),
                f"{also}model {gib(memory.worst.total_bytes)} per GPU"
                + (f", {gib(projected)} at the run's x{scale:.2f}" if scale > 1 else "")
                + f" ({verdict})",
            )
        )
    return note, fixes


class GpuOutOfMemory:
    """One GPU API's out-of-memory lines, each a `Watch`; the finding is the same for every API."""

    name: str
    api: str
    _oom: re.Pattern[str]
    _other: re.Pattern[str]
    watches: tuple[Watch, ...]

    def detect(self, log: LogText, context: RunContext | None) -> Finding | None:
        hits = log.find(self._oom) or log.find(self._other)
        if not hits:
            return None
        match = hits[0][1]
        line = match.string  # the line it matched, prefix stripped
        cause = "A GPU ran out of memory"
        needed = None
        if match.re is self._oom:
            cause += f" allocating {match.group(1)}"
            capacity, free = match.group(3) or match.group(6), match.group(4)
            if capacity:
                gpu = match.group(2) or match.group(5)
                cause += f" (GPU {gpu}: {capacity} total" + (f", {free} free)" if free else ")")
            in_use = _IN_USE.search(line)
            other = _OTHER_PROCESS.search(line)
            if other and in_use and size_bytes(other.group(2)) > size_bytes(in_use.group(1)):
                cause += (
                    f"; another process (pid {other.group(1)}) holds {other.group(2)} of that GPU, more than "
                    f"this one ({in_use.group(1)}): the GPU was not free (a leftover or concurrent job), so "
                    "free it or run on other GPUs before changing the spec"
                )
            if in_use:
                needed = size_bytes(in_use.group(1)) + size_bytes(match.group(1))
            elif capacity and free:
                needed = size_bytes(capacity) - size_bytes(free) + size_bytes(match.group(1))
        building = bool(log.find(_BUILD_FRAME, 1)) and not log.find(_STEP_FRAME, 1)
        cause += (
            " while the model was being built or loaded, before any training step: its weights alone do not "
            "fit, so only spreading them over more GPUs (or sharding them) helps."
            if building
            else ". Activations peak in the first backward of the first pipeline stage; weights, gradients "
            "and optimizer states are fixed by the layout."
        )
        fixes = generic_fixes()
        if context is not None and context.trains:  # a serve-only job's KV-cache budget: VllmKvCacheTooSmall
            note, fixes = planned_fixes(context, needed)
            cause += note
        if building:
            fixes = [fix for fix in fixes if fix.key not in _ACTIVATION_KEYS]
        return Finding(self.name, f"{self.api} out of memory", cause, tuple(e for e, _ in hits), tuple(fixes))


_FRAMES = (Watch(_BUILD_FRAME, (b'File "',), keep=1), Watch(_STEP_FRAME, (b'File "',), keep=1))


class CudaOutOfMemory(GpuOutOfMemory):
    name, api = "cuda_oom", "CUDA"
    _oom, _other = _allocator_oom("CUDA"), _CUDA_OTHER
    watches = (
        Watch(_oom, (b"CUDA out of memory. Tried to allocate ",)),
        Watch(_other, (b"CUDA error: out of memory", b"OutOfMemoryError", b"THCudaCheck FAIL")),
        *_FRAMES,
    )


class HipOutOfMemory(GpuOutOfMemory):
    """torch on ROCm (AMD Instinct): the allocator's message hipified, or the HIP runtime's error."""

    name, api = "hip_oom", "HIP"
    _oom, _other = _allocator_oom("HIP"), _HIP_OTHER
    watches = (
        Watch(_oom, (b"HIP out of memory. Tried to allocate ",)),
        Watch(_other, (b"HIP error: out of memory", b"hipErrorOutOfMemory")),
        *_FRAMES,
    )
