"""HuggingFace models built from lmspec's model presets (configs only, nothing downloaded)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from lmspec.compiler.families import FAMILIES
from lmspec.compiler.spec.load import compose_spec
from lmspec.compiler.spec.sections import ModelSpec, Spec
from lmspec.compiler.spec.typed import from_dict

MODEL_PRESETS = ("tiny", "tiny_moe", "llama3_8b", "llama3_70b", "mixtral_8x7b", "deepseek_v2_lite", "deepseek_v3")


def spec_of(*overrides: str) -> Spec:
    """The typed spec of a composition, without the semantic rules (tests probe layouts that fail them)."""
    return from_dict(Spec, compose_spec(list(overrides)).spec)


def hf_model(m: ModelSpec, device: str = "meta", attn_implementation: str = "eager") -> Any:
    """The family's transformers class built from the config lmspec emits for `m` (convert/mapping.json's
    hf_config, also what the DeepSpeed trainer builds): counting its parameters checks both."""
    import torch
    import transformers

    from lmspec.runtime.train.deepspeed.trainer import transformers_config

    cls = getattr(transformers, FAMILIES[m.family].hf_class)
    with torch.device(device):
        return cls(transformers_config(m, attn_implementation))


@pytest.fixture
def build_hf_model() -> Callable[..., Any]:
    return hf_model
