"""Every file under specs/ composes, validates against the schema, and the shipped numbers hold."""

from __future__ import annotations

from pathlib import Path

import pytest

from lmspec.compiler.errors import SpecError
from lmspec.compiler.paths import SPECS_DIR
from lmspec.compiler.pipeline import checked
from lmspec.compiler.spec.load import compose_spec
from lmspec.compiler.spec.schema_check import schema_problems

GROUP_FILES = sorted(p for p in SPECS_DIR.rglob("*.yaml") if p.parent != SPECS_DIR)
PRIMARY_FILES = sorted(SPECS_DIR.glob("*.yaml"))


def test_spec_tree_is_not_empty() -> None:
    groups = {p.parent.name for p in GROUP_FILES}
    assert {"model", "hardware", "parallel", "train", "serve", "cluster", "convert"} <= groups
    assert len(GROUP_FILES) >= 20


@pytest.mark.parametrize("path", GROUP_FILES, ids=lambda p: str(p.relative_to(SPECS_DIR)))
def test_every_group_option_composes_and_matches_the_schema(path: Path) -> None:
    composed = compose_spec([f"{path.parent.name}={path.stem}"])
    assert schema_problems(composed.spec, composed.origins) == []


@pytest.mark.parametrize("path", PRIMARY_FILES, ids=lambda p: p.name)
def test_every_composed_preset_validates(path: Path) -> None:
    composed = compose_spec([], spec_file=path)
    try:
        checked(composed)
    except SpecError as exc:  # pragma: no cover - the message is the point
        pytest.fail(f"{path.name} does not validate:\n{exc}")


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("deepseek_v3", dict(num_layers=61, hidden_size=7168, vocab_size=129280, num_attention_heads=128)),
        ("llama3_70b", dict(num_layers=80, hidden_size=8192, ffn_hidden_size=28672, num_kv_heads=8)),
        ("mixtral_8x7b", dict(num_layers=32, vocab_size=32000, max_position_embeddings=32768)),
    ],
)
def test_presets_carry_published_architecture(model: str, expected: dict[str, int]) -> None:
    spec = compose_spec([f"model={model}"]).spec["model"]
    assert {k: spec[k] for k in expected} == expected


def test_deepseek_v3_moe_and_mla_numbers() -> None:
    model = compose_spec(["model=deepseek_v3"]).spec["model"]
    assert model["moe"] == {
        "num_experts": 256,
        "top_k": 8,
        "num_shared_experts": 1,
        "ffn_hidden_size": 2048,
        "first_dense_layers": 3,
        "router_score_bias": True,
        "router_score_function": "sigmoid",
        "router_num_groups": 8,
        "router_group_topk": 4,
        "routed_scaling_factor": 2.5,
        "norm_topk_prob": True,
    }
    assert model["mla"] == {
        "q_lora_rank": 1536,
        "kv_lora_rank": 512,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
    }
    assert model["rope_scaling"]["type"] == "yarn" and model["rope_scaling"]["factor"] == 40.0


def test_tiny_is_gqa_with_head_dim_32() -> None:
    model = compose_spec([]).spec["model"]
    assert model["num_kv_heads"] < model["num_attention_heads"]
    assert model["head_dim"] == 32
