"""model.rope_scaling reaches megatron-core's RotaryEmbedding as GPTModel passes it, and the rotary
angles it makes are transformers' for the same rope_parameters (what the converted config.json says)."""

from __future__ import annotations

import pytest
import torch
from helpers.specs import spec_of

from lmspec.compiler.backends.megatron_config import rope_scaling_settings
from lmspec.compiler.families.hf import rope_scaling

LLAMA3 = (
    "model.rope_scaling={type:llama3,factor:8.0,original_max_position_embeddings:8192,low_freq_factor:1.0,"
    "high_freq_factor:4.0,beta_fast:null,beta_slow:null,mscale:null,mscale_all_dim:null}"
)
LINEAR = (
    "model.rope_scaling={type:linear,factor:4.0,original_max_position_embeddings:null,low_freq_factor:null,"
    "high_freq_factor:null,beta_fast:null,beta_slow:null,mscale:null,mscale_all_dim:null}"
)
POSITIONS = 64


@pytest.mark.parametrize("scaling", [LLAMA3, LINEAR], ids=["llama3", "linear"])
def test_megatron_rotary_angles_are_transformers(scaling: str) -> None:
    import transformers
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    m = spec_of(scaling, "model.rope_theta=500000.0", "model.max_position_embeddings=131072").model
    rotary = RotaryEmbedding(
        kv_channels=m.head_dim,
        rotary_percent=1.0,
        rotary_base=int(m.rope_theta),
        use_cpu_initialization=True,
        cp_group=object(),  # unused without context parallelism; avoids megatron's parallel_state
        **rope_scaling_settings(m),
    )
    megatron_angles = rotary.get_freqs_non_repeated(POSITIONS)  # [s, dim/2]: position x frequency, as forward
    parameters = {"rope_theta": m.rope_theta, **(rope_scaling(m) or {})}
    config = transformers.LlamaConfig(
        hidden_size=m.hidden_size,
        num_attention_heads=m.num_attention_heads,
        head_dim=m.head_dim,
        max_position_embeddings=m.max_position_embeddings,
        rope_parameters=parameters,
    )
    inv_freq, _ = ROPE_INIT_FUNCTIONS[parameters["rope_type"]](config, "cpu")
    hf_angles = torch.arange(POSITIONS, dtype=torch.float32)[:, None] * inv_freq[None, :].float()
    plain = torch.arange(POSITIONS, dtype=torch.float32)[:, None] * (
        1.0 / m.rope_theta ** (torch.arange(0, m.head_dim, 2, dtype=torch.float32) / m.head_dim)
    )
    assert not torch.allclose(hf_angles, plain, atol=1e-3)  # the scaling changes the angles at these positions
    torch.testing.assert_close(megatron_angles.float(), hf_angles, rtol=1e-6, atol=1e-6)
