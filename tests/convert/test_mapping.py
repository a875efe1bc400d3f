"""convert/mapping.json against upstream: transformers' own model classes name and shape every HF tensor."""

from __future__ import annotations

import json
import math

import pytest
import torch
from helpers.paths import ROOT

from lmspec.compiler.build.files import MAPPING
from lmspec.compiler.conversion.document import tensors
from lmspec.compiler.emit.conversion import emit_conversion
from lmspec.compiler.pipeline import make_plan


def mapping(overrides: list[str], spec: str | None = None) -> dict:
    plan = make_plan(overrides, ROOT / "specs" / f"{spec}.yaml" if spec else None)
    return json.loads(emit_conversion(plan)[MAPPING])


def hf_names_and_shapes(doc: dict) -> dict[str, tuple[int, ...]]:
    return {name: t.transform.hf_shapes()[name] for t in tensors(doc) for name in t.transform.hf}


def transformers_state(doc: dict) -> dict[str, tuple[int, ...]]:
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(**{k: v for k, v in doc["hf_config"].items() if k != "architectures"})
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    assert type(model).__name__ == doc["hf_config"]["architectures"][0]
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def test_llama_mapping_names_every_transformers_tensor() -> None:
    doc = mapping(["hardware=cpu", "parallel.tp=2"])
    assert hf_names_and_shapes(doc) == transformers_state(doc)


def test_deepseek_v3_mapping_matches_transformers_with_fused_experts() -> None:
    """transformers 5 fuses experts at load time (gate_up_proj [E, 2f, h], down_proj [E, h, f]); the
    mapping writes the released per-expert names, which its conversion mapping fuses."""
    doc = mapping(["parallel.tp=2", "parallel.sequence_parallel=true"], spec="tiny_moe_pretrain_2rank_cpu_fp32")
    ours = hf_names_and_shapes(doc)
    theirs = transformers_state(doc)
    per_expert = {n: s for n, s in ours.items() if ".mlp.experts." in n}
    assert {n: s for n, s in ours.items() if n not in per_expert} == {
        n: s for n, s in theirs.items() if ".mlp.experts." not in n
    }
    moe = doc["hf_config"]
    for layer in range(moe["first_k_dense_replace"], moe["num_hidden_layers"]):
        prefix = f"model.layers.{layer}.mlp.experts"
        e, f, h = moe["n_routed_experts"], moe["moe_intermediate_size"], moe["hidden_size"]
        assert theirs[f"{prefix}.gate_up_proj"] == (e, 2 * f, h) and theirs[f"{prefix}.down_proj"] == (e, h, f)
        for expert in range(e):
            assert per_expert[f"{prefix}.{expert}.gate_proj.weight"] == (f, h)
            assert per_expert[f"{prefix}.{expert}.down_proj.weight"] == (h, f)


@pytest.mark.parametrize("ep", [2, 4])
def test_expert_global_id_is_local_plus_ep_rank_times_experts_per_rank(ep: int) -> None:
    doc = (
        mapping([f"parallel.ep={ep}"], spec="tiny_moe_pretrain_2rank_cpu_fp32")
        if ep == 2
        else mapping(["parallel.ep=4", "hardware.gpus_per_node=4"], spec="tiny_moe_pretrain_2rank_cpu_fp32")
    )
    per_rank = 8 // ep
    fc1 = [t for t in tensors(doc) if t.key == "decoder.layers.1.mlp.experts.experts.linear_fc1.weight"]
    assert [t.index for t in fc1] == [(e,) for e in range(8)]
    for e, t in enumerate(fc1):
        assert t.ep_rank == e // per_rank
        assert t.model_key == f"decoder.layers.1.mlp.experts.local_experts.{e % per_rank}.linear_fc1.weight"
        assert t.transform.hf == (
            f"model.layers.1.mlp.experts.{e}.gate_proj.weight",
            f"model.layers.1.mlp.experts.{e}.up_proj.weight",
        )


@pytest.mark.parametrize(
    "overrides,spec",
    [
        (["hardware=cpu", "parallel.tp=2"], None),
        (["parallel.tp=2", "parallel.sequence_parallel=true"], "tiny_moe_pretrain_2rank_cpu_fp32"),
    ],
)
def test_rank_boxes_tile_every_tensor_exactly_once(overrides: list[str], spec: str | None) -> None:
    for t in tensors(mapping(overrides, spec)):
        tr = t.transform
        boxes = {box for rank in range(tr.parts) for box in tr.boxes(rank)}
        covered = sum(math.prod(b - a for a, b in box) for box in boxes)
        assert covered == math.prod(tr.shape), t.label
        for rank in range(tr.parts):
            rows = (
                sum(box[tr.split_dim][1] - box[tr.split_dim][0] for box in tr.boxes(rank))
                if tr.split_dim is not None
                else None
            )
            if rows is not None:
                assert rows == tr.local_shape()[tr.split_dim]


def test_pipeline_stage_and_local_layer_follow_the_plan() -> None:
    doc = mapping(["hardware=cpu", "parallel.pp=2"])
    by_label = {t.label: t for t in tensors(doc)}
    qkv3 = by_label["decoder.layers.self_attention.linear_qkv.weight[3]"]
    assert (qkv3.pp_rank, qkv3.model_key) == (1, "decoder.layers.1.self_attention.linear_qkv.weight")
    assert by_label["output_layer.weight"].pp_rank == 1 and by_label["embedding.word_embeddings.weight"].pp_rank == 0


def test_mapping_is_deterministic_and_small_for_deepseek_v3() -> None:
    spec = ROOT / "specs" / "deepseek_v3_pretrain_2048gpu_h800_bf16.yaml"
    overrides = ["train.recompute=full", "serve.quantization=fp8"]  # keep it valid whatever the memory rules say
    first, second = (emit_conversion(make_plan(overrides, spec))[MAPPING] for _ in range(2))
    assert first == second
    assert len(first) < 2 * 2**20  # one entry per layer stands for its 256 experts
