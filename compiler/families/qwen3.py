"""Qwen3 (Qwen3ForCausalLM): Llama's layers with a per-head RMSNorm on queries and keys (q_norm,
k_norm) and an explicit head_dim (Qwen3-32B: 64 heads x 128 > hidden 5120); no attention biases."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from lmspec.compiler.conversion.rows import LayerRows, decoder_layer
from lmspec.compiler.families import hf, hf_import, megatron
from lmspec.compiler.families.family import Family, MegatronConfig

if TYPE_CHECKING:
    from lmspec.compiler.families.hf_import import HfConfig
    from lmspec.compiler.spec.sections import ModelSpec


@dataclass(frozen=True)
class Qwen3(Family):
    fixed: ClassVar[tuple[tuple[str, Any], ...]] = (("qkv_bias", False), ("qk_norm", True))

    def layer_rows(self, m: ModelSpec, layer: int) -> LayerRows:
        return decoder_layer(m, layer, moe=None)

    def hf_config(self, m: ModelSpec) -> dict[str, Any]:
        return hf.decoder_config(self, m, {"use_sliding_window": False, "sliding_window": None})

    def from_hf_config(self, config: HfConfig) -> dict[str, Any]:
        fields = hf_import.decoder_fields(config)
        hf_import.full_attention(config)
        config.expect("attention_bias", False, why="Qwen3's attention_bias also biases o_proj, which lmspec has not")
        return {**fields, **dict(self.fixed)}

    def megatron(self, m: ModelSpec) -> MegatronConfig:
        return megatron.decoder_config(m)


QWEN3 = Qwen3(hf_class="Qwen3ForCausalLM", hf_model_type="qwen3")
