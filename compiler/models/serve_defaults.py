"""vLLM's per-hardware defaults for `vllm serve`, the one place lmspec decides them.

vLLM 0.32 fills `max_num_seqs` and `max_num_batched_tokens` left unset from the device it starts on
(`EngineArgs.get_batch_defaults`, usage context OPENAI_API_SERVER) and derives the CUDA-graph capture
sizes from them (`VllmConfig._set_cudagraph_sizes`). The memory model, the performance model and the
budget rule all read the values here, so a spec that leaves a key null is priced with the number
vLLM will really use, while vllm.yaml keeps omitting it.
"""

from __future__ import annotations

from lmspec.compiler.models.dims import device_kind
from lmspec.compiler.models.units import GIB
from lmspec.compiler.spec.sections import HardwareSpec, ServingSpec

# torch.cuda.mem_get_info's total on an H100 80GB is 79.19 GiB: the "80 GB" label is rounded and the
# driver keeps a reserve. vLLM reads this total (`MemorySnapshot.measure`, `get_device_total_memory`);
# the same fraction of the label stands for the other GPUs, which vLLM sees the same way.
VISIBLE_MEMORY_FRACTION = 79.19 / 80

# get_batch_defaults, OPENAI_API_SERVER column: (device memory floor GiB, batched tokens, seqs).
LARGE_GPU_GIB, LARGE_GPU_DEFAULTS = 160, (16384, 1024)  # B200/B300 class
HOPPER_GPU_GIB, HOPPER_GPU_DEFAULTS = 70, (8192, 1024)  # H100/H200 class, A100 excluded by name
OTHER_GPU_DEFAULTS = (2048, 256)
CPU_DEFAULTS_PER_RANK = (2048, 128)  # multiplied by tp x pp on the CPU platform

# _set_cudagraph_sizes: captures 1, 2, 4, multiples of 8 below 256, then multiples of 16 up to
# min(2 x max_num_seqs, 512) (1024 on data-centre Blackwell, which no preset is), never above
# max_num_batched_tokens, plus max_num_batched_tokens and max_num_seqs where they fit.
CUDAGRAPH_MAX_CAPTURE = 512
CUDAGRAPH_FINE_STEP_END = 256


def visible_memory_bytes(hw: HardwareSpec) -> int:
    """Per-GPU memory as vLLM measures it: the total of torch.cuda.mem_get_info, below the label."""
    return round(hw.gpu.memory_gib * VISIBLE_MEMORY_FRACTION * GIB)


def _batch_defaults(spec: ServingSpec) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) that get_batch_defaults picks for `vllm serve`."""
    hw, s = spec.hardware, spec.serve
    if device_kind(spec) == "cpu":
        world = s.tp * s.pp
        tokens, seqs = CPU_DEFAULTS_PER_RANK
        return tokens * world, seqs * world
    visible = visible_memory_bytes(hw)
    if visible >= LARGE_GPU_GIB * GIB:
        return LARGE_GPU_DEFAULTS
    if visible >= HOPPER_GPU_GIB * GIB and "a100" not in hw.gpu.name.lower():
        return HOPPER_GPU_DEFAULTS
    return OTHER_GPU_DEFAULTS


def max_num_batched_tokens(spec: ServingSpec) -> int:
    """serve.max_num_batched_tokens, or vLLM's default: chunked prefill is on for every decoder model
    lmspec serves, so the default is not raised to max_model_len, only capped at what max_num_seqs
    sequences of max_model_len could hold."""
    s = spec.serve
    if s.max_num_batched_tokens is not None:
        return s.max_num_batched_tokens
    tokens, seqs = _batch_defaults(spec)
    return min((s.max_num_seqs or seqs) * s.max_model_len, tokens)


def max_num_seqs(spec: ServingSpec) -> int:
    """serve.max_num_seqs, or vLLM's default for the hardware, never above the token budget."""
    s = spec.serve
    if s.max_num_seqs is not None:
        return s.max_num_seqs
    return min(_batch_defaults(spec)[1], max_num_batched_tokens(spec))


def cudagraph_capture_sizes(spec: ServingSpec) -> list[int]:
    """Batch sizes (tokens) vLLM captures CUDA graphs for; none when eager or on a CPU."""
    if spec.serve.enforce_eager or device_kind(spec) == "cpu":
        return []
    seqs, tokens = max_num_seqs(spec), max_num_batched_tokens(spec)
    ceiling = min(seqs * 2, CUDAGRAPH_MAX_CAPTURE, tokens)
    sizes = {n for n in (1, 2, 4) if n <= ceiling}
    sizes |= set(range(8, min(ceiling + 1, CUDAGRAPH_FINE_STEP_END), 8))
    sizes |= set(range(CUDAGRAPH_FINE_STEP_END, ceiling + 1, 16))
    sizes |= {n for n in (tokens, seqs) if n <= ceiling}
    return sorted(sizes)
