"""lmspec.runtime.compat.deepspeed relies on DeepSpeed's backend calling `build_shm_op()` by its module name."""

from __future__ import annotations

import inspect

import pytest
import torch

from lmspec.runtime.compat import deepspeed as ds_compat
from lmspec.runtime.compat.seam import installed_version

ds_torch = pytest.importorskip("deepspeed.comm.torch")


def test_the_installed_deepspeed_is_the_release_patched() -> None:
    assert installed_version("deepspeed") == ds_compat.DEEPSPEED


def test_the_backend_builds_the_op_through_the_module_function() -> None:
    assert ds_torch.__name__ == "deepspeed.comm.torch"  # the module, not torch re-exported as deepspeed.comm.torch
    assert list(inspect.signature(ds_torch.build_shm_op).parameters) == []
    assert "build_shm_op()" in inspect.getsource(ds_torch.TorchBackend.__init__)
    assert "ShareMemCommBuilder" in inspect.getsource(ds_torch.build_shm_op)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the build is skipped only without CUDA")
def test_the_build_is_skipped_inside_the_block_only() -> None:
    original = ds_torch.build_shm_op
    with ds_compat.no_cpu_shm_op_build() as skipped:
        assert skipped is True
        assert ds_torch.build_shm_op() is None and ds_torch.build_shm_op is not original
    assert ds_torch.build_shm_op is original


def test_another_release_warns_and_patches_nothing(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(ds_compat, "DEEPSPEED", "0.0.1")
    original = ds_torch.build_shm_op
    with ds_compat.no_cpu_shm_op_build() as skipped:
        assert skipped is False and ds_torch.build_shm_op is original
    [record] = caplog.records
    message = record.getMessage()
    assert f"deepspeed {installed_version('deepspeed')} is installed" in message and "deepspeed 0.0.1" in message
