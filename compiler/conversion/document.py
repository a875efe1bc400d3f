"""Read convert/mapping.json back into transforms: the runtime executes the reviewed file, not the spec.

`tensors(doc)` lists every full Megatron tensor of the mapping (expert entries expanded,
one per global expert id) with its transform rebuilt from the entry's own fields.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

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
    Transform,
)

TRANSFORMS: dict[SplitKind, type[Transform]] = {
    SplitKind.REPLICATED: Replicated,
    SplitKind.DIRECT: Direct,
    SplitKind.COLUMN: ColumnParallel,
    SplitKind.ROW: RowParallel,
    SplitKind.QKV: QKV,
    SplitKind.GATED_MLP: GatedMLP,
    SplitKind.MLA_DOWN: MlaDown,
    SplitKind.MLA_UP: MlaUp,
}
_EXTRA_FIELDS = {
    SplitKind.QKV: ("heads", "groups", "head_dim"),
    SplitKind.MLA_DOWN: ("latent", "rope_dim"),
    SplitKind.MLA_UP: ("heads", "head_rows"),
}


@dataclass(frozen=True)
class Tensor:
    """One full Megatron tensor of the mapping, ready to execute."""

    transform: Transform
    key: str  # checkpoint key (no trainer prefix)
    index: tuple[int, ...]  # leading indices into the checkpoint tensor
    dtype: str
    hf_dtype: str
    model_key: str  # state_dict key in the running model
    pp_rank: int
    ep_rank: int | None

    @property
    def label(self) -> str:
        return self.key + "".join(f"[{i}]" for i in self.index)


def transform_from_doc(
    doc: Mapping[str, Any], name: str, classes: Mapping[SplitKind, type[Transform]] = TRANSFORMS
) -> Transform:
    kind = SplitKind(doc["kind"])
    extra = {field: doc[field] for field in _EXTRA_FIELDS.get(kind, ())}
    if "head_rows" in extra:
        extra["head_rows"] = tuple(extra["head_rows"])
    hf = tuple(item["name"] for item in doc["hf"])  # a list: the order is the transform's (q, k, v)
    return classes[kind](name, hf, tuple(doc["megatron_shape"]), doc["ranks"], **extra)


def _expanded(doc: Mapping[str, Any]) -> list[tuple[dict[str, Any], int | None]]:
    experts = doc.get("experts")
    if not experts:
        return [(dict(doc), None)]
    out = []
    for e in range(experts["count"]):
        ep_rank, local = divmod(e, experts["per_ep_rank"])  # e = local + ep_rank * per_ep_rank
        one = dict(doc)
        one["hf"] = [{**item, "name": item["name"].format(e=e)} for item in doc["hf"]]
        one["megatron"] = {**doc["megatron"], "index": [*doc["megatron"]["index"], e]}
        one["model"] = {**doc["model"], "key": doc["model"]["key"].format(i=local)}
        out.append((one, ep_rank))
    return out


def tensors(doc: Mapping[str, Any], classes: Mapping[SplitKind, type[Transform]] = TRANSFORMS) -> list[Tensor]:
    """Every full tensor of a megatron-backend mapping document, in file order."""
    out = []
    for entry in doc["tensors"]:
        for one, ep_rank in _expanded(entry):
            src, model = one["megatron"], one["model"]
            label = src["key"] + "".join(f"[{i}]" for i in src["index"])
            out.append(
                Tensor(
                    transform_from_doc(one, label, classes),
                    src["key"],
                    tuple(src["index"]),
                    src["dtype"],
                    one["hf_dtype"],
                    model["key"],
                    model["pp_rank"],
                    ep_rank,
                )
            )
    return out
