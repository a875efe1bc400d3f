"""HuggingFace models built from lmspec's model presets (configs only, nothing downloaded)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from lmspec.compiler.spec.load import compose_spec
from lmspec.compiler.spec.sections import ModelSpec, Spec
from lmspec.compiler.spec.typed import from_dict

MODEL_PRESETS = ("tiny", "tiny_moe", "llama3_8b", "llama3_70b", "mixtral_8x7b", "deepseek_v2_lite", "deepseek_v3")


def spec_of(*overrides: str) -> Spec:
    """The typed spec of a composition, without the semantic rules (tests probe layouts that fail them)."""
    return from_dict(Spec, compose_spec(list(overrides)).spec)


def hf_config(m: ModelSpec, attn_implementation: str = "eager") -> Any:
    """The transformers config lmspec emits for this architecture (convert/mapping.json's hf_config,
    also what the DeepSpeed trainer builds): counting its parameters checks both."""
    import transformers

    from lmspec.compiler.conversion.mapping import hf_model_config

    config = hf_model_config(m) | {"use_cache": False}
    config.pop("architectures")
    return transformers.AutoConfig.for_model(**config, attn_implementation=attn_implementation)


def hf_model(m: ModelSpec, device: str = "meta", attn_implementation: str = "eager") -> Any:
    import torch
    import transformers

    cls = {
        "llama": transformers.LlamaForCausalLM,
        "mixtral": transformers.MixtralForCausalLM,
        "deepseek_v2": transformers.DeepseekV2ForCausalLM,
        "deepseek_v3": transformers.DeepseekV3ForCausalLM,
    }
    with torch.device(device):
        return cls[m.family](hf_config(m, attn_implementation))


@pytest.fixture
def build_hf_model() -> Callable[..., Any]:
    return hf_model
