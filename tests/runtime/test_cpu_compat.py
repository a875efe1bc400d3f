"""lmspec.runtime.compat.megatron: patches megatron-core only without CUDA, only inside its block,
and relies on call sites megatron-core 0.16.1 still has.

The block checks run in a fresh interpreter each: they compare torch and megatron modules
before, inside and after, which an earlier test of the same session could have imported.
"""

from __future__ import annotations

import inspect
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from lmspec.runtime.compat import megatron
from lmspec.runtime.compat.seam import installed_version

CUDA_NAMES = (
    "current_device",
    "synchronize",
    "get_rng_state",
    "set_rng_state",
    "manual_seed",
    "Stream",
    "Event",
    "current_stream",
    "stream",
)


def _python(code: str) -> None:
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]


def test_the_installed_megatron_core_is_the_release_patched() -> None:
    assert installed_version("megatron-core") == megatron.MEGATRON_CORE


@pytest.mark.slow  # a fresh Python importing megatron-core (and torch, transformers)
def test_inactive_when_cuda_is_available() -> None:
    _python(f"""
        from unittest import mock
        import torch
        from lmspec.runtime.compat.megatron import megatron_on_cpu
        names = {CUDA_NAMES!r}
        before = {{n: getattr(torch.cuda, n) for n in names}}
        with mock.patch.object(torch.cuda, "is_available", return_value=True):
            with megatron_on_cpu() as patched:
                assert patched is False
                assert {{n: getattr(torch.cuda, n) for n in names}} == before
        from megatron.core.pipeline_parallel import schedules
        from megatron.core.optimizer import optimizer
        from megatron.core.optimizer.clip_grads import clip_grad_by_total_norm_fp32
        from megatron.core.transformer.moe import token_dispatcher
        from megatron.core.transformer.moe.moe_utils import maybe_move_tensor_to_cpu
        assert schedules.torch is torch
        assert optimizer.clip_grad_by_total_norm_fp32 is clip_grad_by_total_norm_fp32
        assert token_dispatcher.maybe_move_tensor_to_cpu is maybe_move_tensor_to_cpu
    """)


@pytest.mark.slow  # a fresh Python importing megatron-core (and torch, transformers)
def test_active_inside_the_block_and_undone_after_it() -> None:
    _python(f"""
        import importlib
        import torch
        assert not torch.cuda.is_available()
        from lmspec.runtime.compat.megatron import CUDA_LITERAL_MODULES, megatron_on_cpu
        from megatron.core.optimizer import clip_grads, optimizer
        from megatron.core.tensor_parallel import random as mrandom
        from megatron.core.transformer.moe import token_dispatcher

        def state():
            modules = [importlib.import_module(m) for m in CUDA_LITERAL_MODULES]
            return (
                [getattr(torch.cuda, n) for n in {CUDA_NAMES!r}],
                [m.torch for m in modules],
                [mrandom._get_cuda_rng_state, mrandom._set_cuda_rng_state, token_dispatcher.maybe_move_tensor_to_cpu,
                 clip_grads.clip_grad_by_total_norm_fp32, optimizer.clip_grad_by_total_norm_fp32],
            )

        before = state()
        with megatron_on_cpu() as patched:
            assert patched is True
            assert torch.cuda.current_device() == "cpu"
            from megatron.core.pipeline_parallel import schedules
            assert schedules.torch is not torch
            assert schedules.torch.empty(2, device="cuda").device.type == "cpu"
            assert torch.cuda.Stream() is torch.cuda.current_stream()
            torch.cuda.manual_seed(3); a = torch.rand(1); torch.manual_seed(3); assert torch.equal(a, torch.rand(1))
            with megatron_on_cpu() as inner:  # nested: the outer block restores
                assert inner is True
            assert torch.cuda.current_device() == "cpu"
            import transformers.generation  # annotations such as `torch.cuda.Stream | None` still evaluate
        after = state()
        assert all(a is b for a, b in zip(before[0] + before[1] + before[2], after[0] + after[1] + after[2]))
        assert all(m.torch is torch for m in map(importlib.import_module, CUDA_LITERAL_MODULES))
    """)


@pytest.mark.slow  # a fresh Python importing megatron-core (and torch, transformers)
def test_transformers_loads_a_model_after_the_block(tmp_path: Path) -> None:
    """verify runs megatron first, then transformers' from_pretrained: nothing of the block remains."""
    _python(f"""
        import torch
        from transformers import AutoModelForCausalLM, LlamaConfig
        from lmspec.runtime.compat.megatron import megatron_on_cpu
        config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                             num_key_value_heads=2, vocab_size=64)
        AutoModelForCausalLM.from_config(config).save_pretrained({str(tmp_path)!r})
        current_device = torch.cuda.current_device
        with megatron_on_cpu():
            from megatron.core import tensor_parallel
        model = AutoModelForCausalLM.from_pretrained({str(tmp_path)!r}, dtype=torch.float32)
        assert model(input_ids=torch.zeros(1, 4, dtype=torch.long)).logits.shape == (1, 4, 64)
        assert torch.cuda.current_device is current_device
    """)


@pytest.mark.parametrize("name", megatron.CUDA_LITERAL_MODULES)
def test_each_proxied_module_still_allocates_on_cuda_through_its_torch(name: str) -> None:
    """A module that no longer names a CUDA device literally (or no longer imports torch as `torch`) leaves
    the list; one that allocates on `torch.cuda.current_device()` alone needs no proxy."""
    import importlib

    import torch

    module = importlib.import_module(name)
    assert module.torch is torch
    source = inspect.getsource(module)
    assert any(s in source for s in ('"cuda"', "'cuda'", ".cuda()")), name


def test_the_replaced_functions_have_the_signatures_of_their_stand_ins() -> None:
    from megatron.core.optimizer import clip_grads, optimizer
    from megatron.core.tensor_parallel import random as mrandom
    from megatron.core.transformer.moe import moe_utils, token_dispatcher

    def names(function: object) -> list[str]:
        return list(inspect.signature(function).parameters)  # type: ignore[arg-type]

    assert names(token_dispatcher.maybe_move_tensor_to_cpu) == ["tensor", "as_numpy", "record_stream"]
    assert token_dispatcher.maybe_move_tensor_to_cpu is moe_utils.maybe_move_tensor_to_cpu
    assert names(clip_grads.clip_grad_by_total_norm_fp32) == [
        "parameters",
        "max_norm",
        "total_norm",
        "use_decoupled_grad",
    ]
    assert optimizer.clip_grad_by_total_norm_fp32 is clip_grads.clip_grad_by_total_norm_fp32
    assert callable(mrandom._get_cuda_rng_state) and callable(mrandom._set_cuda_rng_state)
    assert "maybe_move_tensor_to_cpu(" in inspect.getsource(token_dispatcher)
    assert "clip_grad_by_total_norm_fp32(" in inspect.getsource(optimizer)


def test_the_embedding_copy_of_a_later_stage_still_moves_with_tensor_cuda() -> None:
    """Item 7: megatron-core moves a later stage's embedding copy (MTP, tied head) with `.cuda()` in this one
    method, which the block runs with `Tensor.cuda` as the identity; outside it `Tensor.cuda` is torch's."""
    import torch
    from megatron.core.models.common.language_module.language_module import LanguageModule

    assert "weight.data = weight.data.cuda()" in inspect.getsource(LanguageModule.setup_embeddings_and_output_layer)
    cuda = torch.Tensor.cuda
    with megatron.megatron_on_cpu():
        assert torch.Tensor.cuda is cuda


def test_fused_swiglu_runs_eagerly_inside_the_block_with_its_gradients() -> None:
    """Item 8: inside the block megatron's compiled SwiGLU helpers are their eager functions (no inductor
    build), SwiGLUFunction still gives SiLU(a) * b and its gradient; after it they are compiled again."""
    import torch
    import torch.nn.functional as F
    from megatron.core.fusions import fused_bias_swiglu

    from lmspec.runtime.compat.megatron import COMPILED_SWIGLU, megatron_on_cpu

    compiled = {name: getattr(fused_bias_swiglu, name) for name in COMPILED_SWIGLU}
    x = torch.randn(5, 3, 8, dtype=torch.float64, requires_grad=True)
    with megatron_on_cpu():
        assert all(getattr(fused_bias_swiglu, n) is compiled[n].__wrapped__ for n in COMPILED_SWIGLU)
        fused = fused_bias_swiglu.bias_swiglu_impl(x, None, False, False)
        (fused_grad,) = torch.autograd.grad(fused.sum(), x)
    a, b = torch.chunk(x, 2, -1)
    reference = F.silu(a) * b
    (reference_grad,) = torch.autograd.grad(reference.sum(), x)
    assert torch.allclose(fused, reference) and torch.allclose(fused_grad, reference_grad)
    assert all(getattr(fused_bias_swiglu, n) is compiled[n] for n in COMPILED_SWIGLU)
