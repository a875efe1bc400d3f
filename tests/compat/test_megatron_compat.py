"""lmspec.runtime.compat.megatron.without_transformer_engine relies on two bugs megatron-core 0.16.1 has
where Transformer Engine is not installed: these tests fail when either changes, so the patch is
retired with it, and show that the patch lives only as long as its block."""

from __future__ import annotations

import importlib.util
import inspect

import pytest

mla = pytest.importorskip("megatron.core.transformer.multi_latent_attention")

import torch  # noqa: E402
from megatron.core.transformer.moe import moe_utils  # noqa: E402

from lmspec.runtime.compat.megatron import MEGATRON_CORE, SEAM, without_transformer_engine  # noqa: E402
from lmspec.runtime.compat.seam import require  # noqa: E402

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("transformer_engine") is not None, reason="Transformer Engine is installed: no bug"
)


def _route() -> torch.Tensor:
    """The MoE router's gating GEMM, as megatron-core's TopKRouter calls it every forward."""
    return moe_utils.router_gating_linear(torch.ones(2, 4), torch.ones(3, 4), None, torch.float32)


def test_the_installed_megatron_core_is_the_release_patched_here() -> None:
    require(SEAM, "megatron-core", MEGATRON_CORE)


def test_megatron_core_still_has_both_bugs_without_transformer_engine() -> None:
    # MLA believes TE imported (its import succeeds with mock names) and checks isinstance against a mock
    assert mla.HAVE_TE is True and not isinstance(mla.TELinear, type)
    assert "isinstance(self.linear_proj, TELinear)" in inspect.getsource(mla.MultiLatentAttention.__init__)
    # the router's gating GEMM reads a name moe_utils defines only when TE imports
    assert not hasattr(moe_utils, "te_general_gemm")
    assert "te_general_gemm is not None" in inspect.getsource(moe_utils.RouterGatingLinearFunction.forward)
    with pytest.raises(NameError, match="te_general_gemm"):
        _route()


def test_both_are_patched_inside_the_block_only() -> None:
    with without_transformer_engine() as patched:
        assert patched is True
        assert mla.HAVE_TE is False and moe_utils.te_general_gemm is None
        assert _route().shape == (2, 3)
        with without_transformer_engine() as inner:  # nested: the outer block restores
            assert inner is False
        assert mla.HAVE_TE is False and moe_utils.te_general_gemm is None
    assert mla.HAVE_TE is True and not hasattr(moe_utils, "te_general_gemm")
