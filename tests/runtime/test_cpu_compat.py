"""The CPU compatibility layer for megatron-core is inert wherever CUDA is available."""

from __future__ import annotations

import subprocess
import sys
from unittest import mock

import torch

from runtime import cpu_compat


def test_inactive_when_cuda_is_available() -> None:
    before = (torch.cuda.current_device, torch.cuda.synchronize, torch.cuda.get_rng_state,
              torch.cuda.Stream, torch.cuda.manual_seed)
    with mock.patch.object(torch.cuda, "is_available", return_value=True):
        assert cpu_compat.apply() is False
    after = (torch.cuda.current_device, torch.cuda.synchronize, torch.cuda.get_rng_state,
             torch.cuda.Stream, torch.cuda.manual_seed)
    assert before == after
    from megatron.core.pipeline_parallel import schedules

    assert schedules.torch is torch


def test_active_without_cuda_in_a_fresh_process() -> None:
    code = (
        "import torch\n"
        "assert not torch.cuda.is_available()\n"
        "from runtime import cpu_compat\n"
        "assert cpu_compat.apply() is True\n"
        "assert torch.cuda.current_device() == 'cpu'\n"
        "from megatron.core.pipeline_parallel import schedules\n"
        "assert schedules.torch is not torch and schedules.torch.empty(2, device='cuda').device.type == 'cpu'\n"
        "torch.cuda.manual_seed(3); a = torch.rand(1); torch.manual_seed(3); assert torch.equal(a, torch.rand(1))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
