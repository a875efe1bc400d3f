"""One class per split kind: how a Megatron tensor is sharded over ranks and laid out vs HF.

Each transform describes ONE full Megatron tensor (a layer's slice of a stacked
checkpoint tensor, or one expert's) and the HuggingFace tensor(s) it becomes:

- `boxes(rank)`: the regions of the full Megatron tensor that rank `rank` holds; its
  local shard is those regions concatenated along `split_dim`. This is Megatron's
  sharding, and what dist_checkpointing records as chunk offsets on disk.
- `to_hf(full)` / `from_hf(tensors, cat)`: the layout change between the full Megatron
  tensor and the HF tensor(s) (de-interleave QKV, split gate/up, or none).
- `hf_rows()`: the same layout change as data: each HF tensor as the row ranges of the
  full Megatron tensor it concatenates, so the runtime can copy checkpoint bytes to the
  output file without holding the tensor (see runtime/convert/to_hf.py).
- `merge(shards, cat)` / `split(tensors, cat)`: rank shards <-> HF tensors, composed
  from the two above. Used by the reverse conversion and the tests.

The classes hold no tensors and import no torch: tensors are duck-typed (`narrow`,
`reshape`, slicing) and the caller passes its `cat` (torch.cat). Constructors check
that the shapes and the rank count fit, so a bad table fails at compile time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

from lmspec.compiler.conversion.kinds import SplitKind

Shape = tuple[int, ...]
Box = tuple[tuple[int, int], ...]  # [start, stop) per dimension of the full Megatron tensor
Rows = tuple[int, int]  # [start, stop) along dim 0 of the full Megatron tensor
Cat = Callable[..., Any]  # torch.cat(tensors, dim)


class MappingError(ValueError):
    """A mapping entry whose shapes or rank count do not fit together."""


def _full_box(shape: Shape) -> Box:
    return tuple((0, n) for n in shape)


def _with(box: Box, dim: int, start: int, stop: int) -> Box:
    return box[:dim] + ((start, stop),) + box[dim + 1 :]


def _owner(cls: type, method: str) -> type:
    """The class in `cls`'s MRO that defines `method`."""
    return next(c for c in cls.__mro__ if method in c.__dict__)


class Transform:
    """Base: one full Megatron tensor <-> HF tensors, sharded over `parts` ranks along `split_dim`."""

    kind: ClassVar[SplitKind]
    split_dim: ClassVar[int | None] = None

    def __init__(self, megatron: str, hf: Sequence[str], shape: Shape, parts: int) -> None:
        self.megatron = megatron
        self.hf = tuple(hf)
        self.shape = tuple(int(n) for n in shape)
        self.parts = parts
        if parts < 1:
            raise MappingError(f"{megatron}: {parts} ranks")
        if self.split_dim is not None and self.shape[self.split_dim] % self._granule() != 0:
            raise MappingError(
                f"{megatron}: dim {self.split_dim} of {self.shape} does not split into "
                f"{parts} rank shards of whole {self._granule() // parts}-row units"
            )

    def _granule(self) -> int:
        """The split dimension must be a multiple of this (rows of one unit x ranks)."""
        return self.parts

    # -- sharding ------------------------------------------------------------------------------
    def boxes(self, rank: int) -> list[Box]:
        if self.split_dim is None:
            return [_full_box(self.shape)]
        size = self.shape[self.split_dim] // self.parts
        return [_with(_full_box(self.shape), self.split_dim, rank * size, (rank + 1) * size)]

    def local_shape(self) -> Shape:
        if self.split_dim is None:
            return self.shape
        d = self.split_dim
        rows = sum(b[d][1] - b[d][0] for b in self.boxes(0))
        return self.shape[:d] + (rows,) + self.shape[d + 1 :]

    # -- layout vs HF --------------------------------------------------------------------------
    def hf_shapes(self) -> dict[str, Shape]:
        (name,) = self.hf
        return {name: self.shape}

    def to_hf(self, full: Any) -> dict[str, Any]:
        (name,) = self.hf
        return {name: full}

    def from_hf(self, tensors: Mapping[str, Any], cat: Cat) -> Any:
        (name,) = self.hf
        return tensors[name]

    def hf_rows(self) -> dict[str, list[Rows]] | None:
        """Each HF tensor as the dim-0 row ranges of the full Megatron tensor that `to_hf` concatenates.

        None for a 0-d tensor, and when a subclass overrides `to_hf` without `_rows` (then only
        `to_hf` is right).
        """
        cls = type(self)
        if not self.shape or not issubclass(_owner(cls, "_rows"), _owner(cls, "to_hf")):
            return None
        return self._rows()

    def _rows(self) -> dict[str, list[Rows]]:
        (name,) = self.hf
        return {name: [(0, self.shape[0])]}

    # -- composed -----------------------------------------------------------------------------
    def assemble(self, shards: Sequence[Any], cat: Cat) -> Any:
        """The full Megatron tensor from every rank's local shard (rank order)."""
        if len(shards) != self.parts:
            raise MappingError(f"{self.megatron}: {len(shards)} shards for {self.parts} ranks")
        if self.split_dim is None:
            return shards[0]
        d = self.split_dim
        pieces: list[tuple[int, Any]] = []
        for rank, shard in enumerate(shards):
            offset = 0
            for box in self.boxes(rank):
                length = box[d][1] - box[d][0]
                pieces.append((box[d][0], shard.narrow(d, offset, length)))
                offset += length
        return cat([piece for _, piece in sorted(pieces, key=lambda p: p[0])], d)

    def merge(self, shards: Sequence[Any], cat: Cat) -> dict[str, Any]:
        """Rank shards -> HF tensors."""
        return self.to_hf(self.assemble(shards, cat))

    def shard(self, full: Any, rank: int, cat: Cat) -> Any:
        """Rank `rank`'s local shard of the full Megatron tensor."""
        if self.split_dim is None:
            return full
        d = self.split_dim
        pieces = [full.narrow(d, box[d][0], box[d][1] - box[d][0]) for box in self.boxes(rank)]
        return pieces[0] if len(pieces) == 1 else cat(pieces, d)

    def split(self, tensors: Mapping[str, Any], cat: Cat) -> list[Any]:
        """HF tensors -> every rank's local shard (rank order)."""
        full = self.from_hf(tensors, cat)
        return [self.shard(full, rank, cat) for rank in range(self.parts)]

    def describe(self) -> dict[str, Any]:
        return {
            "kind": self.kind.value,
            "ranks": self.parts,
            "split_dim": self.split_dim,
            "megatron_shape": list(self.shape),
            "rank_shape": list(self.local_shape()),
            "hf": [{"name": name, "shape": list(shape)} for name, shape in self.hf_shapes().items()],
        }


class Replicated(Transform):
    """Every TP rank holds the whole tensor; rank 0's copy is the HF tensor.

        rank 0: [n]      rank 1: [n]   (identical)   ->   HF [n]

    Norm weights, the MoE router and its score-correction bias.
    """

    kind = SplitKind.REPLICATED


class Direct(Replicated):
    """A full tensor already under its final shape (DeepSpeed after ZeRO consolidation): rename only.

    full [*shape]   ->   HF [*shape]
    """

    kind = SplitKind.DIRECT

    def __init__(self, megatron: str, hf: Sequence[str], shape: Shape, parts: int = 1) -> None:
        super().__init__(megatron, hf, shape, 1)


class ColumnParallel(Transform):
    """Output dimension split over TP; the HF tensor is the shards concatenated along dim 0.

        rank 0: [out/tp, in]  ┐
        rank 1: [out/tp, in]  ┴─ cat dim 0 ->  HF [out, in]

    Vocab-parallel embedding, the output head, and column-parallel linears whose rows
    keep HF's order.
    """

    kind = SplitKind.COLUMN
    split_dim = 0


class RowParallel(Transform):
    """Input dimension split over TP; the HF tensor is the shards concatenated along dim 1.

        rank 0: [out, in/tp] │ rank 1: [out, in/tp]  -- cat dim 1 ->  HF [out, in]

    Attention output projection (o_proj) and MLP down projection (down_proj).
    """

    kind = SplitKind.ROW
    split_dim = 1


class QKV(Transform):
    """Fused GQA projection: per query group g, [q heads of g..., k_g, v_g]; groups split over TP.

        full [groups * (heads_per_group + 2) * head_dim, hidden], rows by group:
            [ q_0 .. q_{h-1} | k | v ]_g=0  [ q | k | v ]_g=1  ...
        rank r holds groups r*groups/tp .. (r+1)*groups/tp - 1 (whole groups: cat dim 0)
        ->  HF q_proj [heads * head_dim, hidden], k_proj and v_proj [groups * head_dim, hidden]

    Reading the rows as [all q; all k; all v] (the HF order) is the classic silent bug:
    shapes still fit, logits do not.
    """

    kind = SplitKind.QKV
    split_dim = 0

    def __init__(
        self, megatron: str, hf: Sequence[str], shape: Shape, parts: int, *, heads: int, groups: int, head_dim: int
    ) -> None:
        self.heads, self.groups, self.head_dim = heads, groups, head_dim
        if len(tuple(hf)) != 3:
            raise MappingError(f"{megatron}: QKV needs three HF names (q, k, v), got {list(hf)}")
        if heads % groups:
            raise MappingError(f"{megatron}: {heads} query heads do not divide into {groups} kv groups")
        if groups % parts:
            raise MappingError(f"{megatron}: {groups} kv groups do not split over {parts} TP ranks")
        expected = groups * (heads // groups + 2) * head_dim
        if shape[0] != expected:
            raise MappingError(
                f"{megatron}: {shape[0]} rows, expected groups({groups}) x "
                f"(heads_per_group({heads // groups}) + 2) x head_dim({head_dim}) = {expected}"
            )
        super().__init__(megatron, hf, shape, parts)

    def _granule(self) -> int:
        return self.parts * (self.heads // self.groups + 2) * self.head_dim

    def hf_shapes(self) -> dict[str, Shape]:
        q, k, v = self.hf
        rest = self.shape[1:]
        return {
            q: (self.heads * self.head_dim, *rest),
            k: (self.groups * self.head_dim, *rest),
            v: (self.groups * self.head_dim, *rest),
        }

    def to_hf(self, full: Any) -> dict[str, Any]:
        q, k, v = self.hf
        per_group = self.heads // self.groups
        rest = tuple(full.shape[1:])
        grouped = full.reshape(self.groups, per_group + 2, self.head_dim, *rest)
        return {
            q: grouped[:, :per_group].reshape(self.heads * self.head_dim, *rest),
            k: grouped[:, per_group].reshape(self.groups * self.head_dim, *rest),
            v: grouped[:, per_group + 1].reshape(self.groups * self.head_dim, *rest),
        }

    def _rows(self) -> dict[str, list[Rows]]:
        q, k, v = self.hf
        q_rows = self.heads // self.groups * self.head_dim
        block = q_rows + 2 * self.head_dim
        starts = [g * block for g in range(self.groups)]
        return {
            q: [(s, s + q_rows) for s in starts],
            k: [(s + q_rows, s + q_rows + self.head_dim) for s in starts],
            v: [(s + q_rows + self.head_dim, s + block) for s in starts],
        }

    def from_hf(self, tensors: Mapping[str, Any], cat: Cat) -> Any:
        q, k, v = (tensors[name] for name in self.hf)
        per_group = self.heads // self.groups
        rest = tuple(q.shape[1:])
        grouped = cat(
            [
                q.reshape(self.groups, per_group, self.head_dim, *rest),
                k.reshape(self.groups, 1, self.head_dim, *rest),
                v.reshape(self.groups, 1, self.head_dim, *rest),
            ],
            1,
        )
        return grouped.reshape(self.shape)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "heads": self.heads, "groups": self.groups, "head_dim": self.head_dim}


class GatedMLP(Transform):
    """Fused SwiGLU input projection: each TP rank holds [gate_i; up_i].

        rank 0: [gate_0 (ffn/tp rows); up_0 (ffn/tp rows)]
        rank 1: [gate_1;               up_1              ]
        full (as dist_checkpointing stores it): [gate_0; gate_1; up_0; up_1]
        ->  HF gate_proj = [gate_0; gate_1], up_proj = [up_0; up_1], each [ffn, hidden]

    Concatenating the rank shards as they come ([gate_0; up_0; gate_1; up_1]) and
    cutting in half is the classic silent bug at TP > 1.
    """

    kind = SplitKind.GATED_MLP
    split_dim = 0

    def __init__(self, megatron: str, hf: Sequence[str], shape: Shape, parts: int) -> None:
        if len(tuple(hf)) != 2:
            raise MappingError(f"{megatron}: a gated MLP needs two HF names (gate, up), got {list(hf)}")
        super().__init__(megatron, hf, shape, parts)

    def _granule(self) -> int:
        return 2 * self.parts

    def boxes(self, rank: int) -> list[Box]:
        half = self.shape[0] // 2
        size = half // self.parts
        full = _full_box(self.shape)
        return [
            _with(full, 0, rank * size, (rank + 1) * size),
            _with(full, 0, half + rank * size, half + (rank + 1) * size),
        ]

    def hf_shapes(self) -> dict[str, Shape]:
        gate, up = self.hf
        shape = (self.shape[0] // 2, *self.shape[1:])
        return {gate: shape, up: shape}

    def to_hf(self, full: Any) -> dict[str, Any]:
        gate, up = self.hf
        half = self.shape[0] // 2
        return {gate: full[:half], up: full[half:]}

    def _rows(self) -> dict[str, list[Rows]]:
        gate, up = self.hf
        half = self.shape[0] // 2
        return {gate: [(0, half)], up: [(half, self.shape[0])]}

    def from_hf(self, tensors: Mapping[str, Any], cat: Cat) -> Any:
        gate, up = self.hf
        return cat([tensors[gate], tensors[up]], 0)


class MlaDown(ColumnParallel):
    """MLA down-projection into the latent: rows [latent (rank) | rope key (rope_dim)], column-parallel.

        rank r: [(latent + rope)/tp, hidden]  -- cat dim 0 ->  HF q_a_proj [q_rank, hidden]
                                                   or kv_a_proj_with_mqa [kv_rank + rope_dim, hidden]

    megatron-core's local spec makes these ColumnParallelLinear and gathers the output,
    so a TP cut may fall inside the latent or across the rope boundary; the full rows keep
    DeepSeek's [latent | rope] order, the same as HF.
    """

    kind = SplitKind.MLA_DOWN

    def __init__(
        self, megatron: str, hf: Sequence[str], shape: Shape, parts: int, *, latent: int, rope_dim: int = 0
    ) -> None:
        if shape[0] != latent + rope_dim:
            raise MappingError(f"{megatron}: {shape[0]} rows, expected latent({latent}) + rope({rope_dim})")
        self.latent, self.rope_dim = latent, rope_dim
        super().__init__(megatron, hf, shape, parts)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "latent": self.latent, "rope_dim": self.rope_dim}


class MlaUp(ColumnParallel):
    """MLA up-projection from the latent: per head h, rows [a_h | b_h]; heads split over TP.

        q_up:  per head [q_nope (nope) | q_rope (rope)]    kv_up: per head [k_nope (nope) | v (v_dim)]
        rank r: heads r*heads/tp .. : [heads/tp * (a + b), latent] -- cat dim 0
        ->  HF q_b_proj [heads * (nope + rope), q_rank], kv_b_proj [heads * (nope + v), kv_rank]

    HF keeps the same per-head order, so whole heads per rank is the only constraint.
    """

    kind = SplitKind.MLA_UP

    def __init__(
        self, megatron: str, hf: Sequence[str], shape: Shape, parts: int, *, heads: int, head_rows: tuple[int, int]
    ) -> None:
        self.heads, self.head_rows = heads, tuple(head_rows)
        if shape[0] != heads * sum(head_rows):
            raise MappingError(f"{megatron}: {shape[0]} rows, expected heads({heads}) x {head_rows}")
        if heads % parts:
            raise MappingError(f"{megatron}: {heads} heads do not split over {parts} TP ranks")
        super().__init__(megatron, hf, shape, parts)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "heads": self.heads, "head_rows": list(self.head_rows)}
