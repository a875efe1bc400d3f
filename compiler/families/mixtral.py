"""Mixtral (MixtralForCausalLM): Llama's attention, every MLP a softmax-routed MoE without shared experts.

The rows name Mistral's released checkpoint (`block_sparse_moe`, experts' w1/w3/w2);
transformers 5 renames and fuses them at load time (tests/convert/test_release_names.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lmspec.compiler.conversion.kinds import SplitKind as Split
from lmspec.compiler.conversion.rows import LayerRows, Row, decoder_layer
from lmspec.compiler.families import hf, hf_import, megatron, softmax_router
from lmspec.compiler.families.family import Family, MegatronConfig

if TYPE_CHECKING:
    from lmspec.compiler.families.hf_import import HfConfig
    from lmspec.compiler.spec.sections import ModelSpec

ROUTER = (Row("mlp.router.weight", "mlp.router.weight", ("block_sparse_moe.gate.weight",), Split.REPLICATED, "router"),)
EXPERT = (
    Row(
        "mlp.experts.experts.linear_fc1.weight",
        "mlp.experts.local_experts.{i}.linear_fc1.weight",
        ("block_sparse_moe.experts.{e}.w1.weight", "block_sparse_moe.experts.{e}.w3.weight"),
        Split.GATED_MLP,
        "expert_fc1",
    ),
    Row(
        "mlp.experts.experts.linear_fc2.weight",
        "mlp.experts.local_experts.{i}.linear_fc2.weight",
        ("block_sparse_moe.experts.{e}.w2.weight",),
        Split.ROW,
        "expert_fc2",
    ),
)


@dataclass(frozen=True)
class Mixtral(Family):
    def layer_rows(self, m: ModelSpec, layer: int) -> LayerRows:
        return decoder_layer(m, layer, moe=(ROUTER, EXPERT))

    def hf_config(self, m: ModelSpec) -> dict[str, Any]:
        moe = m.moe
        assert moe is not None, "rule family_carries_the_model requires model.moe for mixtral"
        own = {
            "intermediate_size": moe.ffn_hidden_size,
            "num_local_experts": moe.num_experts,
            "num_experts_per_tok": moe.top_k,
            "sliding_window": None,
            "router_jitter_noise": 0.0,
            "output_router_logits": False,
        }
        return hf.decoder_config(self, m, own)

    def from_hf_config(self, config: HfConfig) -> dict[str, Any]:
        fields = hf_import.decoder_fields(config)
        hf_import.full_attention(config)
        hf_import.inert_attention_bias(config)
        config.expect("router_jitter_noise", 0.0, why="lmspec's router adds no noise")
        experts = int(config.take("num_local_experts"))
        fields["moe"] = {
            "num_experts": experts,
            "top_k": int(config.take("num_experts_per_tok")),
            "num_shared_experts": 0,
            "ffn_hidden_size": fields["ffn_hidden_size"],
            "first_dense_layers": 0,
            "router_score_bias": False,
            "router_score_function": "softmax",
            "router_num_groups": None,
            "router_group_topk": None,
            "routed_scaling_factor": 1.0,
            "norm_topk_prob": True,  # Mixtral renormalises the top-k softmax weights
        }
        return fields

    def megatron(self, m: ModelSpec) -> MegatronConfig:
        return megatron.decoder_config(m)

    def refusals(self, m: ModelSpec) -> list[tuple[str, str]]:
        found = softmax_router.refusals(m, "mixtral")
        if m.moe is not None and not m.moe.norm_topk_prob:
            why = "Mixtral (transformers, vLLM) always renormalises top-k weights; set model.moe.norm_topk_prob=true"
            found.append(("model.moe.norm_topk_prob", why))
        if m.moe is not None and m.moe.first_dense_layers:
            why = "every Mixtral layer is MoE; set model.moe.first_dense_layers=0"
            found.append(("model.moe.first_dense_layers", why))
        return found


MIXTRAL = Mixtral(hf_class="MixtralForCausalLM", hf_model_type="mixtral")
