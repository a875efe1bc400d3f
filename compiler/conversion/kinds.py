"""The kinds of split a Megatron tensor can have relative to its HuggingFace tensor(s)."""

from __future__ import annotations

from enum import Enum


class SplitKind(str, Enum):
    """How one Megatron parameter is sharded over ranks and how it maps to HF tensors.

    The value is what `convert/mapping.json` writes in each entry's `kind`.
    """

    REPLICATED = "replicated"  # every TP rank holds the whole tensor (norms, router)
    COLUMN = "column"  # output dim split over TP: concat dim 0 (embedding, lm head, column-parallel linears)
    ROW = "row"  # input dim split over TP: concat dim 1 (attention out, MLP down)
    QKV = "qkv"  # fused GQA projection, per query group [q_1..q_h, k, v], groups split over TP
    GATED_MLP = "gated_mlp"  # fused SwiGLU fc1, each TP rank holds [gate_i; up_i]
    MLA_DOWN = "mla_down"  # MLA down-projection to the latent (+ shared rope key), column-parallel
    MLA_UP = "mla_up"  # MLA up-projection from the latent, per head [a_h, b_h], column-parallel by heads
    DIRECT = "direct"  # already a full tensor (DeepSpeed ZeRO after consolidation): rename only
