"""The MoE families' tables write the names of the released checkpoints; transformers must load them.

transformers 5 renames Mixtral's `block_sparse_moe` to `mlp` and fuses each layer's experts at
load time (w1/w3 or gate_proj/up_proj -> gate_up_proj [E, 2f, h], w2 or down_proj -> down_proj
[E, h, f]), so the test saves a safetensors checkpoint under the mapping's names and shapes, loads
it with `from_pretrained`, and checks nothing is missing or unexpected and every expert's
gate/up/down (and Qwen3's q/k norms) landed where transformers reads it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from lmspec.compiler.build.files import MAPPING
from lmspec.compiler.conversion.document import tensors
from lmspec.compiler.emit.conversion import emit_conversion
from lmspec.compiler.pipeline import make_plan

SMALL = [
    "hardware=cpu",
    "serve=null",  # conversion only: vLLM's CPU attention does not take head_dim 16
    "model.num_layers=2",
    "model.hidden_size=64",
    "model.ffn_hidden_size=96",
    "model.moe.ffn_hidden_size=96",
    "model.num_attention_heads=4",
    "model.num_kv_heads=2",
    "model.head_dim=16",
    "model.vocab_size=384",  # the byte tokenizer has 258 ids (lmspec.compiler.rules.data)
    "model.max_position_embeddings=256",
    "model.moe.num_experts=4",
]
# family: (preset, class, the release's MoE block, its experts' gate / up / down names)
RELEASES = {
    "mixtral": ("mixtral_8x7b", "MixtralForCausalLM", "block_sparse_moe", ("w1", "w3", "w2")),
    "qwen3_moe": ("qwen3_30b_a3b", "Qwen3MoeForCausalLM", "mlp", ("gate_proj", "up_proj", "down_proj")),
}


@pytest.mark.parametrize("family", sorted(RELEASES))
def test_transformers_loads_the_release_names_with_gate_up_down_in_place(family: str, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    preset, hf_class, block, (gate, up, down) = RELEASES[family]
    overrides = [f"model={preset}", *SMALL] + (["model.moe.top_k=2"] if family == "qwen3_moe" else [])
    doc = json.loads(emit_conversion(make_plan(overrides))[MAPPING])
    assert doc["hf_config"]["architectures"] == [hf_class]
    generator = torch.Generator().manual_seed(0)
    written = {
        name: torch.randn(*t.transform.hf_shapes()[name], generator=generator)
        for t in tensors(doc)
        for name in t.transform.hf
    }
    assert any(f".{block}.experts.3.{up}." in name for name in written)
    save_file(written, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    (tmp_path / "config.json").write_text(json.dumps({**doc["hf_config"], "torch_dtype": "float32"}))

    model, info = AutoModelForCausalLM.from_pretrained(tmp_path, output_loading_info=True, dtype=torch.float32)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    state = model.state_dict()
    for layer in range(2):
        old, new = f"model.layers.{layer}.{block}", f"model.layers.{layer}.mlp"
        assert torch.equal(state[f"{new}.gate.weight"], written[f"{old}.gate.weight"])
        for e in range(4):
            gate_up = state[f"{new}.experts.gate_up_proj"][e]
            expected = torch.cat(
                [written[f"{old}.experts.{e}.{gate}.weight"], written[f"{old}.experts.{e}.{up}.weight"]]
            )
            assert torch.equal(gate_up, expected)
            assert torch.equal(state[f"{new}.experts.down_proj"][e], written[f"{old}.experts.{e}.{down}.weight"])
        attention = f"model.layers.{layer}.self_attn"
        norms = ("q_norm", "k_norm") if family == "qwen3_moe" else ()
        for name in ("k_proj", *norms):
            assert torch.equal(state[f"{attention}.{name}.weight"], written[f"{attention}.{name}.weight"])
    assert len(written) == len(state) + 2 * 4 * 3 - 2 * 2  # per layer the 4 experts' 3 matrices fuse into 2
