"""Build the conversion mapping of a Plan: every HF tensor, where it comes from, how, at what shape.

The tables (compiler/conversion/tables.py) name tensors; this module gives each one its
shape from the ModelSpec, its ranks from the Layout, and its place in the checkpoint
(stacked layer axis or numbered layer, global expert axis) and in the running model
(pipeline stage, local layer index, expert-parallel rank, local expert id).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from lmspec.compiler.conversion import tables as T
from lmspec.compiler.conversion.kinds import SplitKind
from lmspec.compiler.conversion.transforms import (
    QKV,
    ColumnParallel,
    Direct,
    GatedMLP,
    MlaDown,
    MlaUp,
    Replicated,
    RowParallel,
    Shape,
    Transform,
)
from lmspec.compiler.plan import Plan
from lmspec.compiler.spec.sections import ModelSpec

PARAM_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
FP32_TENSORS = ("mlp.router.expert_bias",)  # megatron keeps it fp32; HF's e_score_correction_bias too


@dataclass(frozen=True)
class Entry:
    """One full Megatron tensor -> its HF tensor(s)."""

    transform: Transform
    checkpoint_key: str  # dist-checkpoint key (without the trainer's "model." prefix)
    index: tuple[int, ...]  # leading indices into that checkpoint tensor (stacked layer, expert)
    pp_rank: int  # pipeline stage holding it in the running model
    model_key: str  # state_dict key on that stage
    dtype: str  # in the checkpoint
    hf_dtype: str  # written
    experts: tuple[int, int] | None = None  # (num_experts, ep): one entry per expert, names with {e} / {i}

    def describe(self) -> dict[str, Any]:
        doc = {
            **self.transform.describe(),
            "megatron": {"key": self.checkpoint_key, "index": list(self.index), "dtype": self.dtype},
            "model": {"key": self.model_key, "pp_rank": self.pp_rank},
            "hf_dtype": self.hf_dtype,
        }
        if self.experts is not None:
            count, ep = self.experts
            doc["experts"] = {
                "count": count,
                "ep": ep,
                "per_ep_rank": count // ep,
                "global_id": "e = i + ep_rank * per_ep_rank (index [e] of the checkpoint's expert axis)",
            }
        return doc


@lru_cache(maxsize=4)
def shape_table(m: ModelSpec) -> dict[str, Shape]:
    """Full Megatron shape of every tensor kind of the family (before any sharding); cached, as
    every tensor of a model asks (DeepSeek-V3: ~900 times). Read it, do not mutate it."""
    h, hd = m.hidden_size, m.head_dim
    shapes: dict[str, Shape] = {
        "vocab": (m.vocab_size, h),
        "hidden": (h,),
        "fc1": (2 * m.ffn_hidden_size, h),
        "fc2": (h, m.ffn_hidden_size),
        "qkv": ((m.num_attention_heads + 2 * m.num_kv_heads) * hd, h),
        "o_proj": (h, m.num_attention_heads * hd),
    }
    if m.mla is not None:
        a, n = m.mla, m.num_attention_heads
        shapes.update(
            {
                "kv_down": (a.kv_lora_rank + a.qk_rope_head_dim, h),
                "kv_rank": (a.kv_lora_rank,),
                "kv_up": (n * (a.qk_nope_head_dim + a.v_head_dim), a.kv_lora_rank),
                "q_proj": (n * (a.qk_nope_head_dim + a.qk_rope_head_dim), h),
                "o_proj": (h, n * a.v_head_dim),
            }
        )
        if a.q_lora_rank is not None:
            shapes.update(
                {
                    "q_down": (a.q_lora_rank, h),
                    "q_rank": (a.q_lora_rank,),
                    "q_up": (n * (a.qk_nope_head_dim + a.qk_rope_head_dim), a.q_lora_rank),
                }
            )
    if m.moe is not None:
        e, f, s = m.moe.num_experts, m.moe.ffn_hidden_size, m.moe.num_shared_experts
        shapes.update(
            {
                "router": (e, h),
                "experts": (e,),
                "expert_fc1": (2 * f, h),
                "expert_fc2": (h, f),
                "shared_fc1": (2 * s * f, h),
                "shared_fc2": (h, s * f),
            }
        )
    return shapes


def make_transform(row: T.Row, m: ModelSpec, megatron: str, hf: tuple[str, ...], parts: int) -> Transform:
    shape = shape_table(m)[row.shape]
    kind = row.kind
    if kind is SplitKind.QKV:
        return QKV(megatron, hf, shape, parts, heads=m.num_attention_heads, groups=m.num_kv_heads, head_dim=m.head_dim)
    if kind is SplitKind.MLA_DOWN:
        assert m.mla is not None
        rope = m.mla.qk_rope_head_dim if row.shape == "kv_down" else 0
        return MlaDown(megatron, hf, shape, parts, latent=shape[0] - rope, rope_dim=rope)
    if kind is SplitKind.MLA_UP:
        assert m.mla is not None
        a = m.mla
        rows = (a.qk_nope_head_dim, a.v_head_dim) if row.shape == "kv_up" else (a.qk_nope_head_dim, a.qk_rope_head_dim)
        return MlaUp(megatron, hf, shape, parts, heads=m.num_attention_heads, head_rows=rows)
    simple = {
        SplitKind.REPLICATED: Replicated,
        SplitKind.COLUMN: ColumnParallel,
        SplitKind.ROW: RowParallel,
        SplitKind.GATED_MLP: GatedMLP,
        SplitKind.DIRECT: Direct,
    }
    return simple[kind](megatron, hf, shape, parts)


def _layer_rows(m: ModelSpec, layer: int) -> tuple[list[T.Row], list[T.Row]]:
    """(rows of this layer, per-expert rows) for the family."""
    mla = m.attention == "mla"
    rows = list(T.MLA_ATTENTION if mla else T.GQA_ATTENTION)
    if mla:
        assert m.mla is not None
        rows[1:1] = T.MLA_Q_COMPRESSED if m.mla.q_lora_rank is not None else T.MLA_Q_DIRECT
    rows.append(T.MLA_PRE_MLP_NORM if mla else T.GQA_PRE_MLP_NORM)
    if m.moe is None or layer < m.moe.first_dense_layers:
        return rows + list(T.DENSE_MLP), []
    if m.family == "mixtral":
        return rows + list(T.MIXTRAL_MOE), list(T.MIXTRAL_EXPERT)
    rows += list(T.DEEPSEEK_MOE if m.moe.num_shared_experts else T.DEEPSEEK_MOE[:1])
    if m.moe.router_score_bias:
        rows.append(T.DEEPSEEK_ROUTER_BIAS)
    return rows, list(T.DEEPSEEK_EXPERT)


def build_entries(plan: Plan) -> list[Entry]:
    """Every tensor of the model, in checkpoint order: embedding, layers (experts by id), norm, head."""
    m, lay = plan.spec.model, plan.layout
    src = PARAM_DTYPES[plan.spec.train.precision]
    dst = plan.spec.convert.dtype
    stacked = m.moe is None  # megatron stacks homogeneous layers on a leading axis; MoE layer lists are not
    last = lay.pp - 1

    def entry(
        row: T.Row,
        key: str,
        index: tuple[int, ...],
        pp_rank: int,
        model_key: str,
        hf: tuple[str, ...],
        parts: int,
        experts: tuple[int, int] | None = None,
    ) -> Entry:
        fp32 = row.checkpoint in FP32_TENSORS
        return Entry(
            make_transform(row, m, key, hf, parts),
            key,
            index,
            pp_rank,
            model_key,
            "float32" if fp32 else src,
            "float32" if fp32 else dst,
            experts,
        )

    entries = [entry(T.EMBEDDING, T.EMBEDDING.checkpoint, (), 0, T.EMBEDDING.model, T.EMBEDDING.hf, lay.tp)]
    start = 0
    for stage, count in enumerate(lay.stage_layers):
        for layer in range(start, start + count):
            local = layer - start
            rows, expert_rows = _layer_rows(m, layer)
            for row in rows:
                key = f"decoder.layers.{row.checkpoint}" if stacked else f"decoder.layers.{layer}.{row.checkpoint}"
                hf = tuple(f"model.layers.{layer}.{name}" for name in row.hf)
                entries.append(
                    entry(
                        row, key, (layer,) if stacked else (), stage, f"decoder.layers.{local}.{row.model}", hf, lay.tp
                    )
                )
            for row in expert_rows:  # one entry stands for every expert; expand_experts() lists them
                assert m.moe is not None
                hf = tuple(f"model.layers.{layer}.{name}" for name in row.hf)
                entries.append(
                    entry(
                        row,
                        f"decoder.layers.{layer}.{row.checkpoint}",
                        (),
                        stage,
                        f"decoder.layers.{local}.{row.model}",
                        hf,
                        lay.etp,
                        (m.moe.num_experts, lay.ep),
                    )
                )
        start += count
    entries.append(entry(T.FINAL_NORM, T.FINAL_NORM.checkpoint, (), last, T.FINAL_NORM.model, T.FINAL_NORM.hf, lay.tp))
    if not m.tie_embeddings:
        entries.append(entry(T.OUTPUT, T.OUTPUT.checkpoint, (), last, T.OUTPUT.model, T.OUTPUT.hf, lay.tp))
    return entries


def hf_config(plan: Plan) -> dict[str, Any]:
    """config.json of the converted model, from the spec (transformers' names)."""
    return dict(sorted({**hf_model_config(plan.spec.model), "torch_dtype": plan.spec.convert.dtype}.items()))


def hf_model_config(m: ModelSpec) -> dict[str, Any]:
    """The transformers architecture of `m`: the one config both the DeepSpeed trainer builds its
    model from and the converted checkpoint carries, so the two cannot drift apart."""
    arch, model_type = T.HF_ARCHITECTURES[m.family]
    config: dict[str, Any] = {
        "architectures": [arch],
        "model_type": model_type,
        "hidden_size": m.hidden_size,
        "intermediate_size": m.ffn_hidden_size,
        "num_hidden_layers": m.num_layers,
        "num_attention_heads": m.num_attention_heads,
        "num_key_value_heads": m.num_kv_heads,
        "head_dim": m.head_dim,
        "vocab_size": m.vocab_size,
        "max_position_embeddings": m.max_position_embeddings,
        "rms_norm_eps": m.norm_eps,
        "rope_theta": m.rope_theta,
        "rope_scaling": None,
        "tie_word_embeddings": m.tie_embeddings,
        "hidden_act": "silu",
        "attention_bias": False,
        "initializer_range": 0.02,
        "use_cache": True,
    }
    if m.family == "llama":
        config["mlp_bias"] = False
    if m.mla is not None:
        a = m.mla
        config.update(
            {
                "q_lora_rank": a.q_lora_rank,
                "kv_lora_rank": a.kv_lora_rank,
                "qk_nope_head_dim": a.qk_nope_head_dim,
                "qk_rope_head_dim": a.qk_rope_head_dim,
                "v_head_dim": a.v_head_dim,
                "head_dim": a.qk_rope_head_dim,
                "rope_interleave": True,
            }
        )
    if m.moe is not None:
        moe = m.moe
        if m.family == "mixtral":
            config.update(
                {
                    "intermediate_size": moe.ffn_hidden_size,
                    "num_local_experts": moe.num_experts,
                    "num_experts_per_tok": moe.top_k,
                    "sliding_window": None,
                    "router_jitter_noise": 0.0,
                    "output_router_logits": False,
                }
            )
        else:
            config.update(
                {
                    "moe_intermediate_size": moe.ffn_hidden_size,
                    "n_routed_experts": moe.num_experts,
                    "n_shared_experts": moe.num_shared_experts,
                    "num_experts_per_tok": moe.top_k,
                    "first_k_dense_replace": moe.first_dense_layers,
                    "moe_layer_freq": 1,
                    "n_group": 1,
                    "topk_group": 1,
                    "norm_topk_prob": True,
                    "routed_scaling_factor": 1.0,
                }
            )
    return dict(sorted(config.items()))
