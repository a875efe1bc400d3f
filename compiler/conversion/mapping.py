"""Build the conversion mapping of a Plan: every HF tensor, where it comes from, how, at what shape.

The rows (lmspec.compiler.conversion.rows, and each family's own in lmspec.compiler.families)
name tensors; this module gives each one its shape from the ModelSpec, its ranks from the
Layout, and its place in the checkpoint (stacked layer axis or numbered layer, global expert
axis) and in the running model (pipeline stage, local layer index, expert-parallel rank, local
expert id).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from lmspec.compiler.conversion.kinds import SplitKind
from lmspec.compiler.conversion.rows import EMBEDDING, FINAL_NORM, OUTPUT, LayerRows, Row
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
from lmspec.compiler.families import FAMILIES
from lmspec.compiler.models.units import PRECISION_DTYPE
from lmspec.compiler.spec.sections import ModelSpec, TrainingSpec

if TYPE_CHECKING:  # the serving models read shape_table, and the Plan is built from them
    from lmspec.compiler.plan import Plan

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
    """Full Megatron shape of every tensor kind of the model (before any sharding); cached, as
    every tensor of a model asks (DeepSeek-V3: ~900 times). Read it, do not mutate it."""
    h, hd = m.hidden_size, m.head_dim
    shapes: dict[str, Shape] = {
        "vocab": (m.vocab_size, h),
        "hidden": (h,),
        "fc1": (2 * m.ffn_hidden_size, h),
        "fc2": (h, m.ffn_hidden_size),
        "qkv": ((m.num_attention_heads + 2 * m.num_kv_heads) * hd, h),
        "qkv_bias": ((m.num_attention_heads + 2 * m.num_kv_heads) * hd,),
        "head": (hd,),
        "o_proj": (h, m.num_attention_heads * hd),
        "eh_proj": (h, 2 * h),  # MTP: [normed embedding; normed hidden state] -> hidden
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


def make_transform(row: Row, m: ModelSpec, megatron: str, hf: tuple[str, ...], parts: int) -> Transform:
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


def build_entries(spec: TrainingSpec, stage_layers: tuple[int, ...]) -> list[Entry]:
    """Every tensor of the model, in checkpoint order: embedding, layers (experts by id), norm, head, then
    the MTP modules (DeepSeek-V3). `stage_layers` are the decoder layers of each pipeline stage
    (models/dims.py). Takes the spec, not the Plan: the rule that the model shards over the layout
    (rules/conversion.py) builds the same entries before there is a Plan. MappingError when a tensor
    does not shard."""
    assert spec.convert is not None, "only a job that converts has a mapping"
    m, lay = spec.model, spec.parallel
    family = FAMILIES[m.family]
    src = PRECISION_DTYPE[spec.train.precision]
    dst = spec.convert.dtype
    stacked = m.moe is None  # megatron stacks homogeneous layers on a leading axis; MoE layer lists are not
    last = lay.pp - 1

    def entry(
        row: Row,
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

    def layer_entries(
        rows: LayerRows, stage: int, key: str, model: str, hf_layer: int, index: tuple[int, ...] = ()
    ) -> list[Entry]:
        """One decoder layer's entries; `key` and `model` prefix its checkpoint and model names."""
        dense, expert_rows = rows
        hf_prefix = f"model.layers.{hf_layer}."
        out = [
            entry(row, key + row.checkpoint, index, stage, model + row.model, _named(hf_prefix, row), lay.tp)
            for row in dense
        ]
        experts = None if m.moe is None else (m.moe.num_experts, lay.ep)
        # one entry stands for every expert; expand_experts() lists them
        out += [
            entry(row, key + row.checkpoint, (), stage, model + row.model, _named(hf_prefix, row), lay.etp, experts)
            for row in expert_rows
        ]
        return out

    entries = [entry(EMBEDDING, EMBEDDING.checkpoint, (), 0, EMBEDDING.model, EMBEDDING.hf, lay.tp)]
    start = 0
    for stage, count in enumerate(stage_layers):
        for layer in range(start, start + count):
            local = f"decoder.layers.{layer - start}."
            rows = family.layer_rows(m, layer)
            if stacked:  # megatron stacks the layers of a model without experts on a leading axis
                entries += layer_entries(rows, stage, "decoder.layers.", local, layer, (layer,))
            else:
                entries += layer_entries(rows, stage, f"decoder.layers.{layer}.", local, layer)
        start += count
    entries.append(entry(FINAL_NORM, FINAL_NORM.checkpoint, (), last, FINAL_NORM.model, FINAL_NORM.hf, lay.tp))
    if not m.tie_embeddings:
        entries.append(entry(OUTPUT, OUTPUT.checkpoint, (), last, OUTPUT.model, OUTPUT.hf, lay.tp))
    mtp = family.mtp_rows()
    for i in range(m.mtp_layers):
        # MTP module i, on the last stage, under the release's names model.layers.{num_layers + i}: its own
        # tensors, its decoder layer (megatron builds it from the decoder's last layer spec), and the
        # release's copies of the embedding and output head, read from the model's own (under pipeline
        # parallelism megatron keeps a copy of the embedding on the last stage for MTP)
        assert mtp is not None, "rules refuse model.mtp_layers > 0 for a family that releases no MTP layers"
        prefix, hf_layer = f"mtp.layers.{i}.", m.num_layers + i
        hf_prefix = f"model.layers.{hf_layer}."
        entries += [
            entry(row, prefix + row.checkpoint, (), last, prefix + row.model, _named(hf_prefix, row), lay.tp)
            for row in mtp.own
        ]
        inner = prefix + "transformer_layer."
        entries += layer_entries(family.layer_rows(m, m.num_layers - 1), last, inner, inner, hf_layer)
        head = EMBEDDING if m.tie_embeddings else OUTPUT
        for row, name in ((EMBEDDING, mtp.embedding), (head, mtp.head)):
            entries.append(entry(row, row.checkpoint, (), last, row.model, (hf_prefix + name,), lay.tp))
    return entries


def _named(prefix: str, row: Row) -> tuple[str, ...]:
    return tuple(prefix + name for name in row.hf)


def hf_config(plan: Plan) -> dict[str, Any]:
    """config.json of the converted model: the family's, from the spec, with the written dtype."""
    config = FAMILIES[plan.spec.model.family].hf_config(plan.spec.model)
    return dict(sorted({**config, "torch_dtype": plan.conversion().dtype}.items()))
