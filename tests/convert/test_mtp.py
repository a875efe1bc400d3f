"""DeepSeek-V3's multi-token prediction converted to the release's names (the MoE model of the conversion
tests carries one MTP module: it trains at TP=2 x EP=2, converts, loads into transformers with matching
logits and round trips HF -> Megatron -> HF exactly in test_end_to_end).

The released checkpoint's MTP module (model.layers.61.*) is derived here from the architecture:
transformers' own DeepseekV3 decoder layer (its names and shapes), the four tensors of the module
itself and its copies of the embedding and head (vLLM's deepseek_mtp.py reads those names), and the
release's FP8 block scales, one `weight_scale_inv` per quantised projection.
"""

from __future__ import annotations

import json

import pytest
import torch
from helpers.convert import Trained, hf_tensors, lmspec
from helpers.paths import ROOT

from lmspec.compiler.build.files import MAPPING
from lmspec.compiler.conversion.document import tensors
from lmspec.compiler.emit.conversion import emit_conversion
from lmspec.compiler.pipeline import make_plan

MTP_OWN = ("enorm.weight", "hnorm.weight", "eh_proj.weight", "shared_head.norm.weight")
MTP_COPIES = ("embed_tokens.weight", "shared_head.head.weight")
# the release keeps these in bf16 (no block scale): norms, the router and its bias, the MTP module's own
# projection and its embedding/head copies; every other 2-D projection is FP8 with a weight_scale_inv
UNQUANTISED = ("layernorm", "mlp.gate.", "enorm", "hnorm", "eh_proj", "shared_head", "embed_tokens")


def _mapping(overrides: list[str], spec: str | None = None) -> dict:
    plan = make_plan(overrides, ROOT / "specs" / f"{spec}.yaml" if spec else None)
    return json.loads(emit_conversion(plan)[MAPPING])


def _hf_shapes(doc: dict) -> dict[str, tuple[int, ...]]:
    return {name: t.transform.hf_shapes()[name] for t in tensors(doc) for name in t.transform.hf}


def _release_layer(config: dict, layer: int) -> dict[str, tuple[int, ...]]:
    """Names and shapes of transformers' DeepseekV3 decoder layer `layer` (meta device), experts unfused
    to the per-expert names the release stores."""
    from transformers import AutoConfig
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3DecoderLayer

    hf_config = AutoConfig.for_model(**{k: v for k, v in config.items() if k != "architectures"})
    with torch.device("meta"):
        decoder = DeepseekV3DecoderLayer(hf_config, layer)
    names: dict[str, tuple[int, ...]] = {}
    for key, value in decoder.state_dict().items():
        if key == "mlp.experts.gate_up_proj":
            e, two_f, h = value.shape
            for i in range(e):
                names[f"mlp.experts.{i}.gate_proj.weight"] = names[f"mlp.experts.{i}.up_proj.weight"] = (two_f // 2, h)
        elif key == "mlp.experts.down_proj":
            for i in range(value.shape[0]):
                names[f"mlp.experts.{i}.down_proj.weight"] = tuple(value.shape[1:])
        else:
            names[key] = tuple(value.shape)
    return {f"model.layers.{layer}.{k}": v for k, v in names.items()}


def test_deepseek_v3_mapping_writes_the_released_mtp_layer_61() -> None:
    doc = _mapping(["train.recompute=full", "serve.quantization=fp8"], spec="deepseek_v3_pretrain_2048gpu_h800_bf16")
    config = doc["hf_config"]
    assert config["num_nextn_predict_layers"] == 1 and config["num_hidden_layers"] == 61
    ours = {n: s for n, s in _hf_shapes(doc).items() if n.startswith("model.layers.61.")}
    h, vocab = config["hidden_size"], config["vocab_size"]
    expected = _release_layer(config, 61)
    expected |= {f"model.layers.61.{n}": (h,) for n in MTP_OWN if "norm" in n}
    expected |= {"model.layers.61.eh_proj.weight": (h, 2 * h)}
    expected |= {f"model.layers.61.{n}": (vocab, h) for n in MTP_COPIES}
    assert ours == expected
    scales = [n for n, s in ours.items() if len(s) == 2 and not any(part in n for part in UNQUANTISED)]
    assert len(ours) + len(scales) == 1564  # issue 18: the release holds 1,564 tensors under model.layers.61


def test_transformers_builds_no_mtp_and_ignores_only_the_releases_layer_61() -> None:
    """Why verify skips the MTP names itself: transformers' pattern names the release's index only."""
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3ForCausalLM

    assert DeepseekV3ForCausalLM._keys_to_ignore_on_load_unexpected == [r"model\.layers\.61.*"]


@pytest.mark.slow
def test_mtp_converts_to_the_release_names_with_its_copies_of_embedding_and_head(tiny_moe_tp2_ep2: Trained) -> None:
    """tiny_moe with one MTP module trained at TP=2, EP=2 (tests/convert/conftest.py); test_end_to_end checks
    its logits against transformers and its HF -> Megatron -> HF round trip, MTP tensors included."""
    trained = tiny_moe_tp2_ep2
    if not (trained.hf_dir / "config.json").is_file():
        assert lmspec("run", str(trained.build), "--stage", "convert", cwd=trained.workdir).returncode == 0
    written = hf_tensors(trained.hf_dir)
    doc = json.loads((trained.workdir / trained.build / "convert" / "mapping.json").read_text())
    expected = {n for n in _hf_shapes(doc) if n.startswith("model.layers.4.")}
    assert {f"model.layers.4.{n}" for n in MTP_OWN + MTP_COPIES} <= expected
    assert {n for n in written if n.startswith("model.layers.4.")} == expected
    assert torch.equal(written["model.layers.4.embed_tokens.weight"], written["model.embed_tokens.weight"])
    assert torch.equal(written["model.layers.4.shared_head.head.weight"], written["lm_head.weight"])
    assert json.loads((trained.hf_dir / "config.json").read_text())["num_nextn_predict_layers"] == 1
