"""The one CPU compatibility layer for megatron-core 0.16.1 (applied only without CUDA).

megatron-core assumes a CUDA device in a handful of places that a CPU run (gloo,
fp32, the local layer spec) reaches. `apply()` patches exactly those, and only
when `torch.cuda.is_available()` is False; on a GPU it does nothing and returns
False, so GPU runs use megatron-core untouched. Call it after
`torch.distributed.init_process_group` and before building the model.

What it changes, and why (see ../shared/NOTES-deps.md):
1. CUDA RNG get/set/seed -> the CPU generator: `model_parallel_cuda_manual_seed`
   and megatron's RNG tracker (which forks states for TP regions) would assert
   "Torch not compiled with CUDA".
2. `torch.cuda.current_device()` -> "cpu": megatron passes it as `device=` when
   allocating buffers (pipeline send/recv shapes, grad buffers, loss sums).
3. `torch.cuda.synchronize()` -> no-op (dist_checkpointing and timers call it);
   CUDA streams and events -> one inert CPU stream (the MoE all-to-all token
   dispatcher overlaps device-to-host copies on a side stream; on CPU there is
   nothing to overlap, so `current_stream()` and `Stream()` are the same object).
4. The MoE dispatcher's "move split sizes to the host as numpy" helper skips
   tensors that are already on the CPU, leaving tensors where
   `all_to_all_single` wants integer lists; on CPU it converts them as on GPU.
5. Gradient clipping: megatron computes the global norm correctly on CPU (TP
   duplicates counted once, model-parallel all-reduce) but its scaling step
   asserts `torch.cuda.FloatTensor`; on CPU the grads are scaled in place by torch.
6. Modules that allocate with a literal `device="cuda"` (or `.cuda()`) get a
   `torch` proxy whose tensor factories map a CUDA device to the CPU
   (`_CUDA_LITERAL_MODULES`); everything else about torch is untouched.
The trainer also passes an explicit causal mask (megatron's default mask helper
allocates on "cuda").
"""

from __future__ import annotations

import contextlib
import importlib
import types
from typing import Any

import torch

# megatron-core modules that allocate on a literal "cuda" device on the paths a CPU run takes.
_CUDA_LITERAL_MODULES = (
    "megatron.core.pipeline_parallel.schedules",
    "megatron.core.pipeline_parallel.p2p_communication",
    "megatron.core.utils",
    "megatron.core.optimizer.optimizer",
    "megatron.core.optimizer.clip_grads",
    "megatron.core.distributed.param_and_grad_buffer",
    "megatron.core.distributed.distributed_data_parallel",
    "megatron.core.transformer.moe.moe_utils",
    "megatron.core.transformer.moe.router",
    "megatron.core.transformer.moe.token_dispatcher",
    "megatron.core.transformer.moe.moe_layer",
    "megatron.core.tensor_parallel.layers",
    "megatron.core.tensor_parallel.mappings",
    "megatron.core.tensor_parallel.cross_entropy",
    "megatron.core.transformer.multi_latent_attention",
)
_FACTORIES = (
    "empty",
    "zeros",
    "ones",
    "full",
    "tensor",
    "arange",
    "rand",
    "randn",
    "empty_like",
    "zeros_like",
    "ones_like",
    "full_like",
)

_applied = False


def _cpu_device(device: Any) -> Any:
    if device is None:
        return None
    text = str(device) if not isinstance(device, int) else "cuda"
    return "cpu" if text.startswith("cuda") else device


class _CpuTorch(types.ModuleType):
    """`torch`, except that tensor factories place a CUDA `device=` on the CPU."""

    def __init__(self) -> None:
        super().__init__("torch")

    def __getattr__(self, name: str) -> Any:
        attr = getattr(torch, name)
        if name not in _FACTORIES:
            return attr

        def factory(*args: Any, **kwargs: Any) -> Any:
            if "device" in kwargs:
                kwargs["device"] = _cpu_device(kwargs["device"])
            return attr(*args, **kwargs)

        return factory


class _CpuEvent:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        return None

    def synchronize(self) -> None:
        return None

    def wait(self, stream: Any = None) -> None:
        return None


class _CpuStream:
    """Stands for every CUDA stream: work on the CPU is already ordered. A class (not a
    function) so that annotations such as `torch.cuda.Stream | None` keep working."""

    _instance: _CpuStream | None = None

    def __new__(cls, *args: Any, **kwargs: Any) -> _CpuStream:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def wait_stream(self, other: Any) -> None:
        return None

    def wait_event(self, event: Any) -> None:
        return None

    def record_event(self, event: Any = None) -> _CpuEvent:
        return _CpuEvent()

    def synchronize(self) -> None:
        return None


def _patch_streams() -> None:
    # CPU stand-ins replace torch.cuda's stream API on purpose (item 3 of the module docstring).
    torch.cuda.Stream = _CpuStream  # type: ignore[misc, assignment]
    torch.cuda.Event = _CpuEvent  # type: ignore[misc, assignment]
    torch.cuda.current_stream = lambda device=None: _CpuStream()  # type: ignore[assignment, return-value]
    torch.cuda.stream = lambda stream=None: contextlib.nullcontext()  # type: ignore[misc, assignment]


def _host_split_sizes(tensor: Any, as_numpy: bool = False, record_stream: bool = False) -> Any:
    if torch.is_tensor(tensor) and as_numpy:
        return tensor.numpy()
    return tensor


def _patch_moe_dispatcher() -> None:
    from megatron.core.transformer.moe import token_dispatcher

    token_dispatcher.maybe_move_tensor_to_cpu = _host_split_sizes


def _clip_grad_by_total_norm(
    parameters: Any, max_norm: float, total_norm: float, use_decoupled_grad: bool = False
) -> None:
    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    clip_coeff = max_norm / (total_norm + 1.0e-6)
    if clip_coeff >= 1.0:
        return
    for param in parameters:
        grad = param.decoupled_grad if use_decoupled_grad else param.grad
        if grad is not None:
            grad.mul_(clip_coeff)


def _patch_clip_grads() -> None:
    from megatron.core.optimizer import clip_grads, optimizer

    clip_grads.clip_grad_by_total_norm_fp32 = _clip_grad_by_total_norm
    optimizer.clip_grad_by_total_norm_fp32 = _clip_grad_by_total_norm


def _manual_seed(seed: int) -> None:
    torch.default_generator.manual_seed(int(seed))


def _patch_rng() -> None:
    from megatron.core.tensor_parallel import random as mrandom

    torch.cuda.get_rng_state = lambda device="cuda": torch.get_rng_state()
    torch.cuda.set_rng_state = lambda new_state, device="cuda": torch.set_rng_state(new_state)
    torch.cuda.manual_seed = _manual_seed
    mrandom._get_cuda_rng_state = lambda *args, **kwargs: torch.get_rng_state()
    mrandom._set_cuda_rng_state = lambda state, *args, **kwargs: torch.set_rng_state(state)


def apply() -> bool:
    """Patch megatron-core for a CPU-only process; returns whether anything was patched."""
    global _applied
    if torch.cuda.is_available():
        return False
    if _applied:
        return True
    _patch_rng()
    _patch_streams()
    _patch_moe_dispatcher()
    _patch_clip_grads()
    # a device, not torch's index, on purpose (item 2 of the module docstring)
    torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment, return-value]
    torch.cuda.synchronize = lambda device=None: None
    proxy = _CpuTorch()
    for name in _CUDA_LITERAL_MODULES:
        module = importlib.import_module(name)
        if getattr(module, "torch", None) is torch:
            module.torch = proxy  # type: ignore[attr-defined]  # the module's own `torch` global, swapped on purpose
    _applied = True
    return True
