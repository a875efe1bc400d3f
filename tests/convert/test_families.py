"""The family registry is complete: every family has its four parts and each part fits its upstream.

A family (lmspec.compiler.families) names a transformers class, builds that class's config.json,
lists its conversion rows and gives megatron-core's TransformerConfig arguments. These tests
hold each part against the library that consumes it, for every shipped model preset, so a new
family file that gets one wrong fails here before any training run.
"""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import pytest
import yaml

from lmspec.compiler.conversion.mapping import shape_table
from lmspec.compiler.families import FAMILIES
from lmspec.compiler.spec.load import compose_spec
from lmspec.compiler.spec.schema import spec_schema
from lmspec.compiler.spec.sections import ModelSpec, Spec
from lmspec.compiler.spec.typed import from_dict

MODELS = Path(__file__).resolve().parents[2] / "specs" / "model"
PRESETS = sorted(path.stem for path in MODELS.glob("*.yaml"))


def preset_family(preset: str) -> str:
    return yaml.safe_load((MODELS / f"{preset}.yaml").read_text(encoding="utf-8"))["family"]


def model_of(preset: str) -> ModelSpec:
    return from_dict(Spec, compose_spec([f"model={preset}"]).spec).model


def test_model_family_takes_exactly_the_registered_names_in_registry_order() -> None:
    assert typing.get_args(typing.get_type_hints(ModelSpec)["family"]) == tuple(FAMILIES)
    assert spec_schema()["properties"]["model"]["properties"]["family"]["enum"] == list(FAMILIES)


def test_every_preset_family_is_registered_and_every_family_has_a_preset() -> None:
    assert {preset_family(preset) for preset in PRESETS} == set(FAMILIES)


@pytest.mark.parametrize("preset", PRESETS)
def test_the_hf_class_is_the_one_transformers_picks_for_the_config(preset: str) -> None:
    """The DeepSpeed trainer and verify build with AutoModelForCausalLM from the config's model_type;
    the tests and config.json's `architectures` name the class: the two must be the same class."""
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    m = model_of(preset)
    family = FAMILIES[m.family]
    config = family.hf_config(m)
    assert config["architectures"] == [family.hf_class] and config["model_type"] == family.hf_model_type
    assert list(config) == sorted(config)
    assert MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[family.hf_model_type] == family.hf_class
    hf_config = transformers.AutoConfig.for_model(**{k: v for k, v in config.items() if k != "architectures"})
    assert type(hf_config) is getattr(transformers, family.hf_class).config_class


@pytest.mark.parametrize("preset", PRESETS)
def test_every_layer_has_rows_whose_shapes_the_model_defines(preset: str) -> None:
    m = model_of(preset)
    shapes = shape_table(m)
    for layer in range(m.num_layers):
        rows, expert_rows = FAMILIES[m.family].layer_rows(m, layer)
        dense = m.moe is None or layer < m.moe.first_dense_layers
        assert rows and (not expert_rows) == dense, (preset, layer)
        for row in [*rows, *expert_rows]:
            assert row.shape in shapes, (preset, layer, row.checkpoint)
            assert ("{e}" in "".join(row.hf)) == (row in expert_rows), (preset, layer, row.checkpoint)


@pytest.mark.parametrize("preset", PRESETS)
def test_the_megatron_arguments_are_fields_of_their_transformer_config(preset: str) -> None:
    import torch.nn.functional as F
    from megatron.core.transformer import transformer_config

    m = model_of(preset)
    architecture = FAMILIES[m.family].megatron(m)
    config_class = getattr(transformer_config, architecture.config_class)
    fields = {field.name for field in dataclasses.fields(config_class)}
    assert set(architecture.kwargs) <= fields, set(architecture.kwargs) - fields
    assert callable(getattr(F, architecture.activation))
    assert config_class is (transformer_config.MLATransformerConfig if m.mla else transformer_config.TransformerConfig)
