"""Qwen3-MoE (Qwen3MoeForCausalLM): Qwen3's attention (per-head QK-norm, explicit head_dim) and a
softmax-routed MoE without shared experts, top-k weights renormalised or not (`norm_topk_prob`).

The rows name Qwen's released checkpoint (`mlp.gate`, experts' gate_proj/up_proj/down_proj);
transformers 5 fuses the experts at load time. Leading dense layers (`moe.first_dense_layers`) are
the release's `mlp_only_layers` [0, k), whose MLP is `intermediate_size` wide, as in transformers and vLLM.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from lmspec.compiler.conversion.kinds import SplitKind as Split
from lmspec.compiler.conversion.rows import PROJ_EXPERTS, LayerRows, Row, decoder_layer
from lmspec.compiler.families import hf, hf_import, megatron, softmax_router
from lmspec.compiler.families.family import Family, MegatronConfig

if TYPE_CHECKING:
    from lmspec.compiler.families.hf_import import HfConfig
    from lmspec.compiler.spec.sections import ModelSpec

ROUTER = (Row("mlp.router.weight", "mlp.router.weight", ("mlp.gate.weight",), Split.REPLICATED, "router"),)


def _dense_layers(config: HfConfig, num_layers: int) -> int:
    """moe.first_dense_layers of the release's MoE layer pattern: every `decoder_sparse_step`-th layer
    sparse except `mlp_only_layers`; lmspec models the pattern "the first k dense, the rest MoE"."""
    step = int(config.take("decoder_sparse_step", 1))
    only = sorted(int(i) for i in config.take("mlp_only_layers", None) or [])
    dense = sorted(set(only) | {i for i in range(num_layers) if (i + 1) % step})
    if dense != list(range(len(dense))) or len(dense) >= num_layers:
        field = "mlp_only_layers" if step == 1 else "decoder_sparse_step"
        raise hf_import.ImportRefused(
            field, f"makes layers {dense} dense; lmspec models only the first k layers dense and at least one MoE"
        )
    return len(dense)


@dataclass(frozen=True)
class Qwen3Moe(Family):
    fixed: ClassVar[tuple[tuple[str, Any], ...]] = (("qkv_bias", False), ("qk_norm", True))

    def layer_rows(self, m: ModelSpec, layer: int) -> LayerRows:
        return decoder_layer(m, layer, moe=(ROUTER, PROJ_EXPERTS))

    def hf_config(self, m: ModelSpec) -> dict[str, Any]:
        moe = m.moe
        assert moe is not None, "rule family_carries_the_model requires model.moe for qwen3_moe"
        own = {
            "moe_intermediate_size": moe.ffn_hidden_size,
            "num_experts": moe.num_experts,
            "num_experts_per_tok": moe.top_k,
            "norm_topk_prob": moe.norm_topk_prob,
            "decoder_sparse_step": 1,
            "mlp_only_layers": list(range(moe.first_dense_layers)),
            "use_sliding_window": False,
            "sliding_window": None,
            "max_window_layers": m.num_layers,
            "output_router_logits": False,
        }
        return hf.decoder_config(self, m, own)

    def from_hf_config(self, config: HfConfig) -> dict[str, Any]:
        fields = hf_import.decoder_fields(config)
        config.expect("attention_bias", False, why="Qwen3's attention_bias also biases o_proj, which lmspec has not")
        hf_import.full_attention(config)
        fields.update(self.fixed)  # Qwen3's attention always norms q and k per head
        fields["moe"] = {
            "num_experts": int(config.take("num_experts")),
            "top_k": int(config.take("num_experts_per_tok")),
            "num_shared_experts": 0,
            "ffn_hidden_size": int(config.take("moe_intermediate_size")),
            "first_dense_layers": _dense_layers(config, fields["num_layers"]),
            "router_score_bias": False,
            "router_score_function": "softmax",
            "router_num_groups": None,
            "router_group_topk": None,
            "routed_scaling_factor": 1.0,
            "norm_topk_prob": bool(config.take("norm_topk_prob", False)),
        }
        return fields

    def megatron(self, m: ModelSpec) -> MegatronConfig:
        return megatron.decoder_config(m)

    def refusals(self, m: ModelSpec) -> list[tuple[str, str]]:
        return softmax_router.refusals(m, "qwen3_moe")


QWEN3_MOE = Qwen3Moe(hf_class="Qwen3MoeForCausalLM", hf_model_type="qwen3_moe")
