"""Parameter counts against the same architectures built by transformers on the meta device."""

from __future__ import annotations

import pytest
from helpers.hf import MODEL_PRESETS, hf_model
from helpers.specs import spec_of

from lmspec.compiler.models.params import count_params

pytest.importorskip("transformers")

# Publicly stated sizes (FACTS.md): total and activated per token, in billions.
PUBLISHED_B = {
    "llama3_8b": (8.0, 8.0),
    "llama3_70b": (70.6, 70.6),
    "mixtral_8x7b": (46.7, 12.9),
    "qwen3_30b_a3b": (30.5, 3.3),
    "deepseek_v2_lite": (15.7, None),
    "deepseek_v3": (671.0, 37.0),
}
MTP_CHECKPOINT_B = 14.0  # DeepSeek-V3 report: 685B checkpoint = 671B main model + 14B MTP module


def _components(model) -> dict[str, int]:  # noqa: ANN001
    """HF parameters grouped the way lmspec reports them, by module name."""
    groups = {
        "embedding": 0,
        "output_head": 0,
        "attention": 0,
        "norms": 0,
        "router": 0,
        "routed_experts": 0,
        "shared_experts": 0,
        "dense_mlp": 0,
    }
    for name, p in model.named_parameters():
        n = p.numel()
        if "embed_tokens" in name:
            groups["embedding"] += n
        elif name.startswith("lm_head"):
            groups["output_head"] += n
        elif ".self_attn." in name:
            groups["attention"] += n
        elif "layernorm" in name or name == "model.norm.weight":
            groups["norms"] += n
        elif ".mlp.gate." in name:
            groups["router"] += n
        elif ".mlp.experts." in name:
            groups["routed_experts"] += n
        elif ".mlp.shared_experts." in name:
            groups["shared_experts"] += n
        else:
            assert ".mlp." in name, name
            groups["dense_mlp"] += n
    return groups


@pytest.mark.parametrize("preset", MODEL_PRESETS)
def test_total_and_components_match_transformers_exactly(preset: str) -> None:
    m = spec_of(f"model={preset}").model
    model = hf_model(m, device="meta")
    counts = count_params(m)
    assert counts.total == sum(p.numel() for p in model.parameters())
    assert {k: getattr(counts, k) for k in _components(model)} == _components(model)
    # DeepSpeed's ZeRO-3 estimator gathers the largest module: its own definition, on the HF module tree
    assert counts.largest_layer == max(sum(p.numel() for p in mod.parameters(recurse=False)) for mod in model.modules())


@pytest.mark.parametrize("preset", MODEL_PRESETS)
def test_active_counts_top_k_of_the_routed_experts(preset: str) -> None:
    m = spec_of(f"model={preset}").model
    model = hf_model(m, device="meta")
    routed = sum(p.numel() for name, p in model.named_parameters() if ".mlp.experts." in name)
    fraction = m.moe.top_k / m.moe.num_experts if m.moe else 0.0
    expected = sum(p.numel() for p in model.parameters()) - routed + round(routed * fraction)
    assert count_params(m).active == expected


@pytest.mark.parametrize("preset", sorted(PUBLISHED_B))
def test_published_sizes(preset: str) -> None:
    counts = count_params(spec_of(f"model={preset}").model)
    total_b, active_b = PUBLISHED_B[preset]
    assert counts.total / 1e9 == pytest.approx(total_b, rel=0.005)
    if active_b is not None:
        assert counts.active / 1e9 == pytest.approx(active_b, rel=0.02)


def test_deepseek_v3_is_not_21b_active_and_mtp_is_apart() -> None:
    counts = count_params(spec_of("model=deepseek_v3").model)
    assert 36e9 < counts.active < 38e9  # the seed's 21B is DeepSeek-V2's number
    # the checkpoint's MTP layer also stores copies of the embedding and the output head
    assert (counts.mtp + counts.embedding + counts.output_head) / 1e9 == pytest.approx(MTP_CHECKPOINT_B, rel=0.05)
