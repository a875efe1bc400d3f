"""Mistral (MistralForCausalLM): Llama's layers without attention/MLP bias fields; the v0.1 release's
sliding window is refused (lmspec attention is full causal), v0.2+'s `sliding_window: null` is Llama."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lmspec.compiler.conversion.rows import LayerRows, decoder_layer
from lmspec.compiler.families import hf, hf_import, megatron
from lmspec.compiler.families.family import Family, MegatronConfig

if TYPE_CHECKING:
    from lmspec.compiler.families.hf_import import HfConfig
    from lmspec.compiler.spec.sections import ModelSpec


@dataclass(frozen=True)
class Mistral(Family):
    def layer_rows(self, m: ModelSpec, layer: int) -> LayerRows:
        return decoder_layer(m, layer, moe=None)

    def hf_config(self, m: ModelSpec) -> dict[str, Any]:
        return hf.decoder_config(self, m, {"sliding_window": None})

    def from_hf_config(self, config: HfConfig) -> dict[str, Any]:
        fields = hf_import.decoder_fields(config)
        hf_import.full_attention(config)
        hf_import.inert_attention_bias(config)
        return fields

    def megatron(self, m: ModelSpec) -> MegatronConfig:
        return megatron.decoder_config(m)


MISTRAL = Mistral(hf_class="MistralForCausalLM", hf_model_type="mistral")
