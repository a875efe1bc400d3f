"""Llama (LlamaForCausalLM): GQA attention, dense SwiGLU MLP, no biases."""

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
class Llama(Family):
    def layer_rows(self, m: ModelSpec, layer: int) -> LayerRows:
        return decoder_layer(m, layer, moe=None)  # Llama has no MoE block: its layers convert as dense

    def hf_config(self, m: ModelSpec) -> dict[str, Any]:
        return hf.decoder_config(self, m, {"mlp_bias": False})

    def from_hf_config(self, config: HfConfig) -> dict[str, Any]:
        fields = hf_import.decoder_fields(config)
        config.expect("attention_bias", False, why="Llama's attention_bias also biases o_proj, which lmspec has not")
        config.expect("mlp_bias", False, why="lmspec's MLPs have no biases")
        return fields

    def megatron(self, m: ModelSpec) -> MegatronConfig:
        return megatron.decoder_config(m)


LLAMA = Llama(hf_class="LlamaForCausalLM", hf_model_type="llama")
