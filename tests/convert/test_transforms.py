"""Transforms against an independent, loop-by-loop model of Megatron's sharding.

Round trips (split then merge) cannot catch symmetric bugs (Megatron-Bridge#1690): each
case builds the rank shards the way megatron-core lays them out, written here head by
head and rank by rank, and compares `merge` to the HF tensors and `split` to the shards.
"""

from __future__ import annotations

import re

import pytest
import torch

from lmspec.compiler.conversion.transforms import (
    QKV,
    ColumnParallel,
    GatedMLP,
    MappingError,
    MlaDown,
    MlaUp,
    Replicated,
    RowParallel,
)

HIDDEN = 24


def rand(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape)))


def megatron_qkv_shards(q, k, v, heads, groups, head_dim, tp):
    """megatron-core's linear_qkv rows: per group g, its query heads, then k_g, then v_g; whole groups per rank."""
    per_group = heads // groups
    rows = []
    for g in range(groups):
        for h in range(g * per_group, (g + 1) * per_group):
            rows.append(q[h * head_dim : (h + 1) * head_dim])
        rows.append(k[g * head_dim : (g + 1) * head_dim])
        rows.append(v[g * head_dim : (g + 1) * head_dim])
    per_rank = len(rows) // tp
    return [torch.cat(rows[r * per_rank : (r + 1) * per_rank]) for r in range(tp)]


@pytest.mark.parametrize("heads,groups,tp", [(8, 2, 1), (8, 2, 2), (4, 4, 2), (8, 1, 1), (12, 4, 4)])
def test_qkv_matches_megatron_group_interleave(heads: int, groups: int, tp: int) -> None:
    head_dim = 4
    q, k, v = rand(heads * head_dim, HIDDEN), rand(groups * head_dim, HIDDEN + 0), rand(groups * head_dim, HIDDEN)
    v = v + 1.0  # k and v must differ
    shards = megatron_qkv_shards(q, k, v, heads, groups, head_dim, tp)
    t = QKV(
        "qkv",
        ("q", "k", "v"),
        ((heads + 2 * groups) * head_dim, HIDDEN),
        tp,
        heads=heads,
        groups=groups,
        head_dim=head_dim,
    )
    merged = t.merge(shards, torch.cat)
    assert torch.equal(merged["q"], q) and torch.equal(merged["k"], k) and torch.equal(merged["v"], v)
    for got, want in zip(t.split({"q": q, "k": k, "v": v}, torch.cat), shards, strict=True):
        assert torch.equal(got, want)
    assert [tuple(s.shape) for s in shards] == [t.local_shape()] * tp


def test_qkv_read_as_plain_concat_is_not_hf() -> None:
    """The bug the transform exists for: [all q; all k; all v] is not megatron's layout when groups > 1."""
    heads, groups, head_dim = 8, 2, 4
    q, k, v = rand(32, HIDDEN), rand(8, HIDDEN), rand(8, HIDDEN) + 1
    (full,) = megatron_qkv_shards(q, k, v, heads, groups, head_dim, 1)
    assert not torch.equal(full[:32], q)


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_gated_mlp_is_gate_up_per_rank(tp: int) -> None:
    ffn = 16
    gate, up = rand(ffn, HIDDEN), rand(ffn, HIDDEN) + 1
    size = ffn // tp
    shards = [torch.cat([gate[r * size : (r + 1) * size], up[r * size : (r + 1) * size]]) for r in range(tp)]
    t = GatedMLP("fc1", ("gate", "up"), (2 * ffn, HIDDEN), tp)
    merged = t.merge(shards, torch.cat)
    assert torch.equal(merged["gate"], gate) and torch.equal(merged["up"], up)
    for got, want in zip(t.split({"gate": gate, "up": up}, torch.cat), shards, strict=True):
        assert torch.equal(got, want)
    if tp > 1:  # halving the naive concatenation of rank shards is wrong
        assert not torch.equal(torch.cat(shards)[:ffn], gate)


@pytest.mark.parametrize("cls,dim", [(ColumnParallel, 0), (RowParallel, 1)])
def test_column_and_row_concat_dims(cls, dim: int) -> None:
    full = rand(16, 16)  # square: the wrong dim would still fit
    shards = list(full.chunk(2, dim=dim))
    t = cls("w", ("w",), (16, 16), 2)
    assert torch.equal(t.merge(shards, torch.cat)["w"], full)
    other = torch.cat(shards, dim=1 - dim)
    assert not torch.equal(other[:, :16] if dim == 0 else other[:16], full)
    for got, want in zip(t.split({"w": full}, torch.cat), shards, strict=True):
        assert torch.equal(got, want)


def test_replicated_takes_one_copy_and_splits_to_all() -> None:
    w = rand(8)
    t = Replicated("norm", ("norm",), (8,), 2)
    assert torch.equal(t.merge([w, w.clone()], torch.cat)["norm"], w)
    assert all(torch.equal(s, w) for s in t.split({"norm": w}, torch.cat))


def test_mla_up_keeps_whole_heads_per_rank() -> None:
    heads, nope, v_dim, rank = 4, 3, 5, 6
    per_head = [rand(nope + v_dim, rank) + h for h in range(heads)]
    hf = torch.cat(per_head)
    t = MlaUp("kv_up", ("kv_b",), (heads * (nope + v_dim), rank), 2, heads=heads, head_rows=(nope, v_dim))
    shards = [torch.cat(per_head[:2]), torch.cat(per_head[2:])]
    assert torch.equal(t.merge(shards, torch.cat)["kv_b"], hf)
    assert t.local_shape() == (2 * (nope + v_dim), rank)


@pytest.mark.parametrize(
    "make,message",
    [
        (
            lambda: QKV("qkv", ("q", "k", "v"), (48, 8), 4, heads=8, groups=2, head_dim=4),
            "2 kv groups do not split over 4",
        ),
        (lambda: QKV("qkv", ("q", "k", "v"), (40, 8), 1, heads=8, groups=2, head_dim=4), "expected groups(2)"),
        (lambda: QKV("qkv", ("q", "k"), (48, 8), 1, heads=8, groups=2, head_dim=4), "three HF names"),
        (lambda: GatedMLP("fc1", ("gate", "up"), (6, 8), 4), "does not split into 4"),
        (lambda: MlaUp("q_up", ("q_b",), (12, 8), 4, heads=2, head_rows=(3, 3)), "2 heads do not split over 4"),
        (lambda: MlaDown("kv_down", ("kv_a",), (10, 8), 1, latent=8, rope_dim=4), "expected latent(8) + rope(4)"),
        (lambda: RowParallel("o", ("o",), (8, 10), 4), "does not split into 4"),
    ],
)
def test_constructors_reject_shapes_that_do_not_fit(make, message: str) -> None:
    with pytest.raises(MappingError, match=re.escape(message)):
        make()


ROW_SELECTIONS = [
    QKV("qkv", ("q", "k", "v"), ((8 + 2 * 2) * 4, HIDDEN), 2, heads=8, groups=2, head_dim=4),
    GatedMLP("fc1", ("gate", "up"), (32, HIDDEN), 2),
    ColumnParallel("w", ("w",), (16, HIDDEN), 2),
    RowParallel("w", ("w",), (16, HIDDEN), 2),
    Replicated("norm", ("norm",), (HIDDEN,), 2),
    MlaDown("kv_down", ("kv_a",), (12, HIDDEN), 2, latent=8, rope_dim=4),
    MlaUp("kv_up", ("kv_b",), (4 * 8, 6), 2, heads=4, head_rows=(3, 5)),
]


@pytest.mark.parametrize("t", ROW_SELECTIONS, ids=lambda t: t.kind.value)
def test_hf_rows_describe_to_hf(t) -> None:
    """The converter copies the rows `hf_rows` names instead of calling `to_hf`: they must agree."""
    full = rand(*t.shape)
    rows = t.hf_rows()
    assert rows is not None and list(rows) == list(t.hf_shapes())
    for name, tensor in t.to_hf(full).items():
        assert torch.equal(torch.cat([full[a:b] for a, b in rows[name]]), tensor)


def test_hf_rows_refuse_a_subclass_that_changes_to_hf_only() -> None:
    """A transform that overrides `to_hf` alone (as the wrong-mapping tests do) must not be copied by rows."""

    class Flipped(ColumnParallel):
        def to_hf(self, full):
            return super().to_hf(full.flip(0))

    assert Flipped("w", ("w",), (16, HIDDEN), 2).hf_rows() is None
    assert ColumnParallel("w", ("w",), (16, HIDDEN), 2).hf_rows() == {"w": [(0, 16)]}
