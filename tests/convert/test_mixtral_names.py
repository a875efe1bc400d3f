"""The Mixtral table writes the names of Mistral's released checkpoint; transformers must load them.

transformers 5 renames `block_sparse_moe` to `mlp` and fuses each layer's experts at load time
(w1/w3 -> gate_up_proj [E, 2f, h], w2 -> down_proj [E, h, f]), so the test saves a
safetensors checkpoint under the mapping's names and shapes, loads it with
`from_pretrained`, and checks nothing is missing or unexpected and every expert's gate/up/down
landed where transformers reads it.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from lmspec.compiler.build.files import MAPPING
from lmspec.compiler.conversion.document import tensors
from lmspec.compiler.emit.conversion import emit_conversion
from lmspec.compiler.pipeline import make_plan

TINY_MIXTRAL = [
    "model=mixtral_8x7b",
    "hardware=cpu",
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


def test_transformers_loads_the_mixtral_names_with_gate_up_down_in_place(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    doc = json.loads(emit_conversion(make_plan(TINY_MIXTRAL))[MAPPING])
    assert doc["hf_config"]["architectures"] == ["MixtralForCausalLM"]
    generator = torch.Generator().manual_seed(0)
    written = {
        name: torch.randn(*t.transform.hf_shapes()[name], generator=generator)
        for t in tensors(doc)
        for name in t.transform.hf
    }
    assert any(".block_sparse_moe.experts.3.w3." in name for name in written)
    save_file(written, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    (tmp_path / "config.json").write_text(json.dumps({**doc["hf_config"], "torch_dtype": "float32"}))

    model, info = AutoModelForCausalLM.from_pretrained(tmp_path, output_loading_info=True, dtype=torch.float32)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    state = model.state_dict()
    for layer in range(2):
        old, new = f"model.layers.{layer}.block_sparse_moe", f"model.layers.{layer}.mlp"
        assert torch.equal(state[f"{new}.gate.weight"], written[f"{old}.gate.weight"])
        for e in range(4):
            gate_up = state[f"{new}.experts.gate_up_proj"][e]
            assert torch.equal(
                gate_up, torch.cat([written[f"{old}.experts.{e}.w1.weight"], written[f"{old}.experts.{e}.w3.weight"]])
            )
            assert torch.equal(state[f"{new}.experts.down_proj"][e], written[f"{old}.experts.{e}.w2.weight"])
        assert torch.equal(
            state[f"model.layers.{layer}.self_attn.k_proj.weight"],
            written[f"model.layers.{layer}.self_attn.k_proj.weight"],
        )
