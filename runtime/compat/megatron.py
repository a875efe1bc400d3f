"""The one CPU compatibility layer for megatron-core 0.16.1 (applied only without CUDA).

megatron-core assumes a CUDA device in a handful of places that a CPU run (gloo,
fp32, the local layer spec) reaches. `with megatron_on_cpu():` patches exactly those
for the block, and only when `torch.cuda.is_available()` is False; on a GPU it
does nothing and yields False, so GPU runs use megatron-core untouched. After the
block every patched attribute is the original again, so code run later (transformers
loading a converted model, say) sees torch and megatron as installed.

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
   (`CUDA_LITERAL_MODULES`); everything else about torch is untouched.
7. A pipeline stage that keeps a copy of the embedding (MTP, or a tied head, off the first
   stage) moves it with `weight.data.cuda()` before the all-reduce that makes the copies equal;
   on CPU `Tensor.cuda` returns the tensor itself, during that one method only.
8. The fused SwiGLU's element-wise helpers (`bias_activation_fusion`) are `torch.compile`d
   (megatron's `jit_fuser`); on a CPU inductor compiles C++ for each new shape (~5 s a process,
   again for each expert's token count until it marks shapes dynamic). They run eagerly here:
   the same arithmetic, and the autograd functions around them still save only their input.
9. Where Transformer Engine is absent (every CPU, and GPUs without TE, which run
   train.transformer_impl=local), two megatron-core 0.16.1 bugs: MLA sets HAVE_TE from an import
   that succeeds with mock names, then calls `isinstance(x, <mock>)` while building the model;
   the MoE router's forward reads `te_general_gemm`, which moe_utils defines only when TE imports.
   `without_transformer_engine()` sets HAVE_TE=False and defines te_general_gemm=None for its
   block; `megatron_on_cpu()` enters it, a GPU trainer on the local path enters it itself.
The trainer also passes an explicit causal mask (megatron's default mask helper
allocates on "cuda").
"""

from __future__ import annotations

import importlib
import types
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, nullcontext
from typing import Any

import torch

from lmspec.runtime.compat.seam import defined, require, swapped

SEAM = "lmspec.runtime.compat.megatron"
# Exact: the patched call sites are this release's; another release may assume CUDA elsewhere
# (a crash deep in megatron) or change what a replaced function must do (wrong gradients).
MEGATRON_CORE = "0.16.1"

# megatron-core modules that allocate on a literal "cuda" device on the paths a CPU run takes (those that
# allocate on `torch.cuda.current_device()` need no proxy: item 2 answers "cpu").
CUDA_LITERAL_MODULES = (
    "megatron.core.pipeline_parallel.schedules",
    "megatron.core.utils",
    "megatron.core.optimizer.optimizer",
    "megatron.core.optimizer.clip_grads",
    "megatron.core.distributed.param_and_grad_buffer",
    "megatron.core.transformer.moe.moe_utils",
    "megatron.core.transformer.moe.token_dispatcher",
    "megatron.core.tensor_parallel.layers",
)
# megatron.core.fusions.fused_bias_swiglu's functions under `@jit_fuser` (item 7).
COMPILED_SWIGLU = (
    "swiglu",
    "bias_swiglu",
    "weighted_swiglu",
    "swiglu_back",
    "bias_swiglu_back",
    "weighted_swiglu_back",
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


def _host_split_sizes(tensor: Any, as_numpy: bool = False, record_stream: bool = False) -> Any:
    if torch.is_tensor(tensor) and as_numpy:
        return tensor.numpy()
    return tensor


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


def _manual_seed(seed: int) -> None:
    torch.default_generator.manual_seed(int(seed))


def _embedding_copies_on_cpu(setup: Any) -> Any:
    """LanguageModule.setup_embeddings_and_output_layer with `Tensor.cuda` the identity inside it (item 7)."""

    def setup_on_cpu(self: Any) -> None:
        with swapped(torch.Tensor, "cuda", lambda tensor, *args, **kwargs: tensor):
            setup(self)

    return setup_on_cpu


def _patches() -> list[tuple[Any, str, Any]]:
    """(owner, attribute, CPU stand-in) for every item of the module docstring."""
    from megatron.core.fusions import fused_bias_swiglu
    from megatron.core.models.common.language_module.language_module import LanguageModule
    from megatron.core.optimizer import clip_grads, optimizer
    from megatron.core.tensor_parallel import random as mrandom
    from megatron.core.transformer.moe import token_dispatcher

    cuda = torch.cuda
    patches: list[tuple[Any, str, Any]] = [
        (cuda, "get_rng_state", lambda device="cuda": torch.get_rng_state()),  # 1
        (cuda, "set_rng_state", lambda new_state, device="cuda": torch.set_rng_state(new_state)),
        (cuda, "manual_seed", _manual_seed),
        (mrandom, "_get_cuda_rng_state", lambda *args, **kwargs: torch.get_rng_state()),
        (mrandom, "_set_cuda_rng_state", lambda state, *args, **kwargs: torch.set_rng_state(state)),
        (cuda, "current_device", lambda: "cpu"),  # 2: a device, not torch's index, on purpose
        (cuda, "synchronize", lambda device=None: None),  # 3
        (cuda, "Stream", _CpuStream),
        (cuda, "Event", _CpuEvent),
        (cuda, "current_stream", lambda device=None: _CpuStream()),
        (cuda, "stream", lambda stream=None: nullcontext()),
        (token_dispatcher, "maybe_move_tensor_to_cpu", _host_split_sizes),  # 4
        (clip_grads, "clip_grad_by_total_norm_fp32", _clip_grad_by_total_norm),  # 5
        (optimizer, "clip_grad_by_total_norm_fp32", _clip_grad_by_total_norm),
        (  # 7
            LanguageModule,
            "setup_embeddings_and_output_layer",
            _embedding_copies_on_cpu(LanguageModule.setup_embeddings_and_output_layer),
        ),
    ]
    for name in COMPILED_SWIGLU:  # 8: torch.compile keeps the eager function as __wrapped__
        patches.append((fused_bias_swiglu, name, getattr(fused_bias_swiglu, name).__wrapped__))
    proxy = _CpuTorch()
    for name in CUDA_LITERAL_MODULES:  # 6: each module's own `torch` global
        module = importlib.import_module(name)
        if getattr(module, "torch", None) is torch:
            patches.append((module, "torch", proxy))
    return patches


@contextmanager
def without_transformer_engine() -> Iterator[bool]:
    """megatron-core's local (pure-PyTorch) path made to build and run where Transformer Engine is not
    installed (item 9) inside the block, untouched after it; yields whether anything is patched (False
    where TE imports, or inside an outer block, which restores). Enter it before building the model and
    keep it for as long as the model runs: the router reads te_general_gemm at every forward."""
    from megatron.core.transformer import multi_latent_attention
    from megatron.core.transformer.moe import moe_utils

    mock_te = multi_latent_attention.HAVE_TE and not isinstance(multi_latent_attention.TELinear, type)
    no_gemm = not hasattr(moe_utils, "te_general_gemm")
    if not (mock_te or no_gemm):
        yield False
        return
    require(SEAM, "megatron-core", MEGATRON_CORE)
    with ExitStack() as stack:
        if mock_te:
            stack.enter_context(swapped(multi_latent_attention, "HAVE_TE", False))
        if no_gemm:
            stack.enter_context(defined(moe_utils, "te_general_gemm", None))
        yield True


_active = False  # inside an outer megatron_on_cpu() block: the outer one restores


@contextmanager
def megatron_on_cpu() -> Iterator[bool]:
    """megatron-core patched for a CPU-only process inside the block, untouched after it; yields
    whether anything is patched (False on a machine with CUDA, where nothing is). Enter it after
    `torch.distributed.init_process_group` and before building the model; blocks may nest."""
    global _active
    if torch.cuda.is_available() or _active:
        yield _active
        return
    require(SEAM, "megatron-core", MEGATRON_CORE)
    with ExitStack() as stack:
        for owner, name, value in _patches():
            stack.enter_context(swapped(owner, name, value))
        stack.enter_context(without_transformer_engine())  # 9: no CPU has Transformer Engine
        _active = True
        try:
            yield True
        finally:
            _active = False
