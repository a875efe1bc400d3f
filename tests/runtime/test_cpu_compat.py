"""The CPU compatibility layer for megatron-core is inert wherever CUDA is available.

Each check runs in a fresh interpreter: `apply()` patches process-wide state, and other
tests in the same session may already have applied it.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap


def _python(code: str) -> None:
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]


def test_inactive_when_cuda_is_available() -> None:
    _python("""
        from unittest import mock
        import torch
        from lmspec.runtime.compat import megatron as cpu_compat
        names = ("current_device", "synchronize", "get_rng_state", "set_rng_state", "manual_seed",
                 "Stream", "Event", "current_stream", "stream")
        before = {n: getattr(torch.cuda, n) for n in names}
        with mock.patch.object(torch.cuda, "is_available", return_value=True):
            assert cpu_compat.apply() is False
        assert {n: getattr(torch.cuda, n) for n in names} == before
        from megatron.core.pipeline_parallel import schedules
        from megatron.core.optimizer import optimizer
        from megatron.core.optimizer.clip_grads import clip_grad_by_total_norm_fp32
        from megatron.core.transformer.moe import token_dispatcher
        from megatron.core.transformer.moe.moe_utils import maybe_move_tensor_to_cpu
        assert schedules.torch is torch
        assert optimizer.clip_grad_by_total_norm_fp32 is clip_grad_by_total_norm_fp32
        assert token_dispatcher.maybe_move_tensor_to_cpu is maybe_move_tensor_to_cpu
    """)


def test_active_without_cuda() -> None:
    _python("""
        import torch
        assert not torch.cuda.is_available()
        from lmspec.runtime.compat import megatron as cpu_compat
        assert cpu_compat.apply() is True
        assert torch.cuda.current_device() == "cpu"
        from megatron.core.pipeline_parallel import schedules
        assert schedules.torch is not torch
        assert schedules.torch.empty(2, device="cuda").device.type == "cpu"
        assert torch.cuda.Stream() is torch.cuda.current_stream()
        torch.cuda.manual_seed(3); a = torch.rand(1); torch.manual_seed(3); assert torch.equal(a, torch.rand(1))
        import transformers.generation  # annotations such as `torch.cuda.Stream | None` still evaluate
    """)
