"""What a model family is: the four things lmspec must know to train, convert and test it.

A family is one HuggingFace architecture (one transformers class). Its module
(lmspec.compiler.families.<name>) subclasses `Family` once; the registry in
lmspec.compiler.families names it. Everything here is plain data: the compiler imports
no torch, and the runtime (runtime/train/megatron/model.py, runtime/train/deepspeed)
turns it into live objects.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

if TYPE_CHECKING:  # compiler/spec/sections/ takes its family names from the registry
    from lmspec.compiler.conversion.rows import LayerRows, MtpRows
    from lmspec.compiler.families.hf_import import HfConfig
    from lmspec.compiler.spec.sections import ModelSpec


@dataclass(frozen=True)
class MegatronConfig:
    """megatron-core's TransformerConfig of an architecture, as data (the runtime adds the
    parallel degrees, precision, recompute and its CPU/no-Transformer-Engine settings)."""

    config_class: Literal["TransformerConfig", "MLATransformerConfig"]  # megatron.core.transformer.transformer_config
    kwargs: Mapping[str, Any]  # its architecture keyword arguments
    activation: str  # torch.nn.functional.<activation>, passed as activation_func


@dataclass(frozen=True)
class Family(ABC):
    """One HF architecture: its transformers class and the three builders the compiler and runtime call."""

    hf_class: str  # transformers' causal-LM class, e.g. "LlamaForCausalLM"
    hf_model_type: str  # its config's model_type (AutoConfig.for_model picks the class by it)
    # (model key, value): what the class hard-codes (Qwen2 always biases q/k/v, Llama never); rule
    # `model_keys_fit_family` refuses another value, which the class could neither convert nor serve
    fixed: ClassVar[tuple[tuple[str, Any], ...]] = (("qkv_bias", False), ("qk_norm", False))
    head_dim_derived: ClassVar[bool] = False  # the class (vLLM's Qwen2) takes head_dim = hidden / heads, ignoring it

    @abstractmethod
    def layer_rows(self, m: ModelSpec, layer: int) -> LayerRows:
        """Conversion rows of decoder layer `layer` (lmspec.compiler.conversion.rows.decoder_layer)."""

    @abstractmethod
    def hf_config(self, m: ModelSpec) -> dict[str, Any]:
        """config.json of the HF model (sorted keys, no dtype): what the conversion writes and the
        DeepSpeed trainer builds its model from, so the two cannot drift apart."""

    @abstractmethod
    def from_hf_config(self, config: HfConfig) -> dict[str, Any]:
        """The model group (specs/model/NAME.yaml's keys but `name` and `family`) of a released
        config.json of this class: the inverse of `hf_config`. Reads every field it keeps through
        `config` and refuses (lmspec.compiler.families.hf_import.ImportRefused) any value lmspec
        would have to approximate; `lmspec import-model` refuses whatever is left unread."""

    @abstractmethod
    def megatron(self, m: ModelSpec) -> MegatronConfig:
        """The TransformerConfig the megatron backend builds this architecture with."""

    def refusals(self, m: ModelSpec) -> list[tuple[str, str]]:
        """(key, why and the way out) of every value of `m` this HF class cannot carry (its transformers
        and vLLM models would compute something else); `lmspec check` refuses each by its key."""
        return []

    def training_refusals(self, m: ModelSpec) -> list[tuple[str, str]]:
        """(key, why and the way out) of every value megatron-core would compute differently from this HF
        class: a model trained by megatron-core and converted would then route or scale otherwise than the
        checkpoint it becomes. Only a spec that trains is refused them: a serve-only job serves the HF
        checkpoint with vLLM, and megatron-core never sees it."""
        return []

    def mtp_rows(self) -> MtpRows | None:
        """Conversion rows of one multi-token-prediction module beside its decoder layer, or None where
        the architecture's released checkpoints name no MTP layers (its specs keep model.mtp_layers=0)."""
        return None
