"""What Qwen3-MoE and Mixtral cannot compute is refused naming the field (import) or the key (check).

The released configs themselves import exactly (tests/models/test_published_configs.py); here each
is altered one field at a time, and a spec is given one MoE key its family's class cannot route.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lmspec.compiler.families import FAMILIES
from lmspec.compiler.families.hf_import import HfConfig, ImportRefused
from lmspec.compiler.rules.context import RuleContext
from lmspec.compiler.rules.model import family_carries_the_model
from lmspec.compiler.spec.sections import ModelSpec
from lmspec.compiler.spec.typed import from_dict

CONFIGS = Path(__file__).parents[1] / "data" / "hf_configs"
RELEASES = {"Qwen3-30B-A3B": "qwen3_moe", "Mixtral-8x7B-v0.1": "mixtral"}  # config file: family


def _released(name: str) -> dict:
    return json.loads((CONFIGS / f"{name}.json").read_text())


def _imported(name: str, config: dict) -> ModelSpec:
    family = RELEASES[name]
    read = HfConfig(config)
    group = FAMILIES[family].from_hf_config(read)
    assert read.unread() == []
    return from_dict(ModelSpec, {"name": name, "family": family, **group})


@pytest.mark.parametrize(
    ("name", "field", "value"),
    [
        ("Mixtral-8x7B-v0.1", "sliding_window", 4096),
        ("Mixtral-8x7B-v0.1", "router_jitter_noise", 0.1),
        ("Qwen3-30B-A3B", "use_sliding_window", True),
        ("Qwen3-30B-A3B", "mlp_only_layers", [3]),
        ("Qwen3-30B-A3B", "decoder_sparse_step", 2),
        ("Qwen3-30B-A3B", "attention_bias", True),
    ],
)
def test_a_field_the_class_cannot_carry_is_refused_by_name(name: str, field: str, value: object) -> None:
    with pytest.raises(ImportRefused) as caught:
        _imported(name, {**_released(name), field: value})
    assert caught.value.field == field


def test_leading_dense_layers_import_as_first_dense_layers() -> None:
    m = _imported("Qwen3-30B-A3B", {**_released("Qwen3-30B-A3B"), "mlp_only_layers": [0, 1]})
    assert m.moe is not None and m.moe.first_dense_layers == 2
    assert FAMILIES["qwen3_moe"].hf_config(m)["mlp_only_layers"] == [0, 1]


@pytest.mark.parametrize(
    ("preset", "override", "key"),
    [
        ("mixtral_8x7b", "model.moe.norm_topk_prob=false", "model.moe.norm_topk_prob"),
        ("mixtral_8x7b", "model.moe.first_dense_layers=1", "model.moe.first_dense_layers"),
        ("qwen3_30b_a3b", "model.moe.router_score_function=sigmoid", "model.moe.router_score_function"),
        ("qwen3_30b_a3b", "model.moe.routed_scaling_factor=2.5", "model.moe.routed_scaling_factor"),
        ("qwen3_30b_a3b", "model.moe.num_shared_experts=1", "model.moe.num_shared_experts"),
    ],
)
def test_a_spec_the_family_cannot_compute_is_refused_naming_the_key(preset: str, override: str, key: str) -> None:
    from lmspec.compiler.spec.load import compose_spec
    from lmspec.compiler.spec.sections import Spec

    composed = compose_spec([f"model={preset}", override])
    problems = list(family_carries_the_model(RuleContext(from_dict(Spec, composed.spec), composed.origins)))
    assert [p.key for p in problems] == [key]
    assert f"set {key}=" in problems[0].message and "command-line override" in problems[0].message
