"""Qwen2 (Qwen2ForCausalLM, the Qwen2.5 releases): Llama's layers with a bias on the q, k and v
projections (none on o_proj); `use_sliding_window: true` is refused (lmspec attention is full causal)."""

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
class Qwen2(Family):
    fixed: ClassVar[tuple[tuple[str, Any], ...]] = (("qkv_bias", True), ("qk_norm", False))
    head_dim_derived: ClassVar[bool] = True

    def layer_rows(self, m: ModelSpec, layer: int) -> LayerRows:
        return decoder_layer(m, layer, moe=None)

    def hf_config(self, m: ModelSpec) -> dict[str, Any]:
        # transformers' and vLLM's Qwen2 always bias q/k/v and derive head_dim = hidden / heads
        return hf.decoder_config(self, m, {"use_sliding_window": False, "sliding_window": None, "use_mrope": False})

    def from_hf_config(self, config: HfConfig) -> dict[str, Any]:
        fields = hf_import.decoder_fields(config)
        hf_import.full_attention(config)
        hf_import.inert_attention_bias(config)
        config.expect("use_mrope", False, why="multimodal rotary sections are Qwen2-VL's, not a text model's")
        return {**fields, **dict(self.fixed)}

    def megatron(self, m: ModelSpec) -> MegatronConfig:
        return megatron.decoder_config(m)


QWEN2 = Qwen2(hf_class="Qwen2ForCausalLM", hf_model_type="qwen2")
