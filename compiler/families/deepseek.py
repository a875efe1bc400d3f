"""DeepSeek-V2 and V3 (DeepseekV2ForCausalLM, DeepseekV3ForCausalLM): MLA, routed + shared experts,
the first layers dense. One code path: V3's router scores with a sigmoid (V2: softmax,
`moe.router_score_function`); its score-correction bias is the spec's `moe.router_score_bias`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lmspec.compiler.conversion.kinds import SplitKind as Split
from lmspec.compiler.conversion.rows import PROJ_EXPERTS, LayerRows, MtpRows, Row, decoder_layer
from lmspec.compiler.families import hf, hf_import, megatron
from lmspec.compiler.families.family import Family, MegatronConfig

if TYPE_CHECKING:
    from lmspec.compiler.families.hf_import import HfConfig
    from lmspec.compiler.spec.sections import ModelSpec, MoeSpec

ROUTER = Row("mlp.router.weight", "mlp.router.weight", ("mlp.gate.weight",), Split.REPLICATED, "router")
SHARED_EXPERTS = (
    Row(
        "mlp.shared_experts.linear_fc1.weight",
        "mlp.shared_experts.linear_fc1.weight",
        ("mlp.shared_experts.gate_proj.weight", "mlp.shared_experts.up_proj.weight"),
        Split.GATED_MLP,
        "shared_fc1",
    ),
    Row(
        "mlp.shared_experts.linear_fc2.weight",
        "mlp.shared_experts.linear_fc2.weight",
        ("mlp.shared_experts.down_proj.weight",),
        Split.ROW,
        "shared_fc2",
    ),
)
ROUTER_BIAS = Row(
    "mlp.router.expert_bias",
    "mlp.router.expert_bias",
    ("mlp.gate.e_score_correction_bias",),
    Split.REPLICATED,
    "experts",
)


# DeepSeek-V3's release names its MTP module model.layers.{num_layers + i} (vLLM's deepseek_mtp.py reads
# them): its decoder layer under the usual names, these four, and copies of the embedding and output head.
MTP = MtpRows(
    own=(
        Row("enorm.weight", "enorm.weight", ("enorm.weight",), Split.REPLICATED, "hidden"),
        Row("hnorm.weight", "hnorm.weight", ("hnorm.weight",), Split.REPLICATED, "hidden"),
        Row("eh_proj.weight", "eh_proj.weight", ("eh_proj.weight",), Split.COLUMN, "eh_proj"),  # [h, 2h]: [emb; hidden]
        Row(
            "final_layernorm.weight", "final_layernorm.weight", ("shared_head.norm.weight",), Split.REPLICATED, "hidden"
        ),
    ),
    embedding="embed_tokens.weight",
    head="shared_head.head.weight",
)


def _hf_rope_scaling(m: ModelSpec) -> dict[str, Any] | None:
    """YaRN as the release writes it (legacy `rope_scaling`, which transformers 5 and vLLM both read)."""
    rs = m.rope_scaling
    if rs is None:
        return None
    fields = ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "mscale", "mscale_all_dim")
    return {"type": rs.type, **{k: getattr(rs, k) for k in fields if getattr(rs, k) is not None}}


# DeepSeek-V3's weights as released: FP8 e4m3 with one float scale_inv per 128x128 block, activations quantised
# at run time. lmspec trains in the spec's dtype; `lmspec run --stage import` dequantises these weights.
RELEASED_FP8 = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}


def _expect_released_fp8(quantization: dict[str, Any]) -> None:
    """Accept only the FP8 block quantisation of DeepSeek's release (weights stored as fp8 x scale_inv)."""
    for field in sorted(set(quantization) | set(RELEASED_FP8)):
        if quantization.get(field) != RELEASED_FP8.get(field):
            raise hf_import.ImportRefused(
                f"quantization_config.{field}",
                f"is {quantization.get(field)!r}; lmspec reads only weights released as {RELEASED_FP8} "
                "(dequantised to the training dtype by `lmspec run --stage import`)",
            )


# How many of a group's best scores sum to the group's score: transformers and vLLM take V2's maximum
# (group_limited_greedy) and V3's top-2 sum; megatron-core sums the top (top_k / router_group_topk).
GROUP_SCORE_TOP = {"deepseek_v2": 1, "deepseek_v3": 2}


def _rope_refusals(m: ModelSpec) -> list[tuple[str, str]]:
    """megatron-core's MLA scales rope with YaRN only; transformers reads mscale and mscale_all_dim only when
    both are non-zero."""
    rs = m.rope_scaling
    if m.attention != "mla" or rs is None:
        return []
    if rs.type != "yarn":
        return [
            (
                "model.rope_scaling.type",
                "megatron-core's multi-latent attention scales rope only with yarn; set "
                "model.rope_scaling.type=yarn with its fields, or model.rope_scaling=null",
            )
        ]
    if not (rs.mscale and rs.mscale_all_dim) and (rs.mscale != 1.0 or rs.mscale_all_dim):
        return [
            (
                "model.rope_scaling.mscale",
                f"with model.rope_scaling.mscale_all_dim={rs.mscale_all_dim} transformers reads the two only when "
                "both are non-zero (else it scales cos/sin as mscale=1.0), megatron-core and vLLM always; set both "
                "non-zero, or mscale=1.0 and mscale_all_dim=0.0",
            )
        ]
    return []


@dataclass(frozen=True)
class DeepSeek(Family):
    releases_mtp: bool  # V3's checkpoints carry its MTP module (config num_nextn_predict_layers)

    def layer_rows(self, m: ModelSpec, layer: int) -> LayerRows:
        if m.moe is None:
            return decoder_layer(m, layer, moe=None)
        routed = [ROUTER, *(SHARED_EXPERTS if m.moe.num_shared_experts else ())]
        if m.moe.router_score_bias:
            routed.append(ROUTER_BIAS)
        return decoder_layer(m, layer, moe=(routed, PROJ_EXPERTS))

    def hf_config(self, m: ModelSpec) -> dict[str, Any]:
        own: dict[str, Any] = {"rope_scaling": _hf_rope_scaling(m)}
        if m.moe is not None:
            own.update(self._hf_router(m.moe))
        if self.releases_mtp:
            own["num_nextn_predict_layers"] = m.mtp_layers
        return hf.decoder_config(self, m, own)

    def _hf_router(self, moe: MoeSpec) -> dict[str, Any]:
        """The experts' and router's keys as both transformers' class and vLLM's deepseek_v2.py read them
        (`refusals` names what either cannot carry)."""
        grouped = moe.router_num_groups is not None
        method = "noaux_tc" if self.releases_mtp else "group_limited_greedy" if grouped else "greedy"
        return {
            "moe_intermediate_size": moe.ffn_hidden_size,
            "n_routed_experts": moe.num_experts,
            "n_shared_experts": moe.num_shared_experts,
            "num_experts_per_tok": moe.top_k,
            "first_k_dense_replace": moe.first_dense_layers,
            "moe_layer_freq": 1,
            "n_group": moe.router_num_groups or 1,
            "topk_group": moe.router_group_topk or 1,
            "topk_method": method,
            "scoring_func": moe.router_score_function,
            "norm_topk_prob": moe.norm_topk_prob,
            "routed_scaling_factor": moe.routed_scaling_factor,
        }

    def from_hf_config(self, config: HfConfig) -> dict[str, Any]:
        fields = hf_import.decoder_fields(config)
        config.expect("attention_bias", False, why="DeepSeek's projections have no biases")
        mla = {
            "q_lora_rank": config.take("q_lora_rank"),
            "kv_lora_rank": int(config.take("kv_lora_rank")),
            "qk_nope_head_dim": int(config.take("qk_nope_head_dim")),
            "qk_rope_head_dim": int(config.take("qk_rope_head_dim")),
            "v_head_dim": int(config.take("v_head_dim")),
        }
        config.take("rope_interleave", True)  # transformers' layout flag of the released rope dims; lmspec's too
        fields.update(
            attention="mla",
            mla=mla,
            num_kv_heads=fields["num_attention_heads"],
            head_dim=mla["qk_nope_head_dim"] + mla["qk_rope_head_dim"],
        )
        if config.has("n_routed_experts") and config.take("n_routed_experts") is not None:
            config.expect("moe_layer_freq", 1, why="lmspec's MoE layers follow the dense ones without gaps")
            config.expect("ep_size", 1, why="a parallel degree of DeepSeek's own code, not of the architecture")
            score = config.expect("scoring_func", "sigmoid" if self.releases_mtp else "softmax", why="the router")
            methods = ("noaux_tc",) if self.releases_mtp else ("greedy", "group_limited_greedy")
            method = config.expect("topk_method", *methods, why="how the release picks experts")
            groups, top = config.take("n_group", None), config.take("topk_group", None)
            grouped = method != "greedy" and groups is not None and groups > 1  # V2's greedy ignores the groups
            fields["moe"] = {
                "num_experts": int(config.take("n_routed_experts")),
                "top_k": int(config.take("num_experts_per_tok")),
                "num_shared_experts": int(config.take("n_shared_experts", 0) or 0),
                "ffn_hidden_size": int(config.take("moe_intermediate_size")),
                "first_dense_layers": int(config.take("first_k_dense_replace", 0)),
                "router_score_bias": self.releases_mtp,  # noaux_tc: the e_score_correction_bias buffer
                "router_score_function": score,
                "router_num_groups": groups if grouped else None,
                "router_group_topk": top if grouped else None,
                "routed_scaling_factor": float(config.take("routed_scaling_factor", 1.0)),
                "norm_topk_prob": bool(config.take("norm_topk_prob", False)),
            }
        if self.releases_mtp:
            fields["mtp_layers"] = int(config.take("num_nextn_predict_layers", 0))
        if config.has("quantization_config"):
            _expect_released_fp8(config.take("quantization_config"))
        return fields

    def refusals(self, m: ModelSpec) -> list[tuple[str, str]]:
        """transformers' DeepseekV2/V3 and vLLM's deepseek_v2.py hard-code part of the router and the rope:
        a value one of them would compute differently (megatron-core's own differences: training_refusals)."""
        found = _rope_refusals(m)
        moe = m.moe
        if moe is None:
            return found
        score, bias = ("sigmoid", True) if self.releases_mtp else ("softmax", False)
        if moe.router_score_function != score:
            found.append(
                (
                    "model.moe.router_score_function",
                    f"transformers' and vLLM's {self.hf_model_type} score experts with {score}; "
                    f"set model.moe.router_score_function={score}",
                )
            )
        if moe.router_score_bias != bias:
            found.append(
                (
                    "model.moe.router_score_bias",
                    f"{self.hf_class} {'always carries' if bias else 'has no'} a score-correction bias "
                    f"(e_score_correction_bias); set model.moe.router_score_bias={str(bias).lower()}",
                )
            )
        if not self.releases_mtp and moe.norm_topk_prob:
            found.append(
                (
                    "model.moe.norm_topk_prob",
                    "transformers' DeepseekV2 ignores norm_topk_prob (it never renormalises the top-k weights) "
                    "while megatron-core and vLLM would; set model.moe.norm_topk_prob=false",
                )
            )
        return found

    def training_refusals(self, m: ModelSpec) -> list[tuple[str, str]]:
        """megatron-core's router where it differs from transformers' and vLLM's DeepseekV2/V3: how it
        weights sigmoid scores and how it scores a group of experts."""
        moe = m.moe
        if moe is None:
            return []
        found = []
        if moe.router_score_function == "sigmoid" and not moe.norm_topk_prob and moe.top_k > 1:
            found.append(
                (
                    "model.moe.norm_topk_prob",
                    "megatron-core always renormalises sigmoid top-k weights (top_k > 1); "
                    "set model.moe.norm_topk_prob=true",
                )
            )
        groups, top, per_group = moe.router_num_groups, moe.router_group_topk, GROUP_SCORE_TOP[self.hf_model_type]
        # a group's score only decides which groups a token may use: where it may use all of them, nothing
        if top is not None and groups is not None and top < groups and moe.top_k != per_group * top:
            fewer = max(moe.top_k // per_group, 1)
            found.append(
                (
                    "model.moe.router_group_topk",
                    f"with model.moe.top_k={moe.top_k} megatron-core scores a group by its top {moe.top_k // top} "
                    f"experts, transformers' and vLLM's {self.hf_model_type} by its top {per_group}; set "
                    f"model.moe.top_k={per_group * top} or model.moe.router_group_topk={fewer}",
                )
            )
        return found

    def mtp_rows(self) -> MtpRows | None:
        return MTP if self.releases_mtp else None

    def megatron(self, m: ModelSpec) -> MegatronConfig:
        return megatron.decoder_config(m)


DEEPSEEK_V2 = DeepSeek(hf_class="DeepseekV2ForCausalLM", hf_model_type="deepseek_v2", releases_mtp=False)
DEEPSEEK_V3 = DeepSeek(hf_class="DeepseekV3ForCausalLM", hf_model_type="deepseek_v3", releases_mtp=True)
