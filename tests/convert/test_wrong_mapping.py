"""A wrong mapping must fail verify and name the layer (shapes alone cannot catch these).

The buggy transforms below are the real classes with one classic mistake, in one layer:
the kv groups of the fused QKV read in the wrong order, and a square matrix transposed.
Both keep every shape, so only the logits can tell.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from helpers.convert import Trained, verify_report

from lmspec.compiler.build.files import DIST_CKPT_DIR
from lmspec.compiler.conversion.document import TRANSFORMS
from lmspec.compiler.conversion.kinds import SplitKind
from lmspec.compiler.conversion.transforms import QKV, RowParallel
from lmspec.runtime.convert.to_hf import convert_megatron, latest_checkpoint

pytestmark = pytest.mark.slow


class SwappedGroupsQKV(QKV):
    """Layer 2 only: kv groups 0 and 1 swapped (their q heads, k and v go to the other group)."""

    def to_hf(self, full: Any) -> dict[str, Any]:
        if self.megatron.endswith("[2]"):
            per_group = (self.heads // self.groups + 2) * self.head_dim
            full = full.reshape(self.groups, per_group, -1).flip(0).reshape(self.shape)
        return super().to_hf(full)


class TransposedRow(RowParallel):
    """Layer 1 only: the square attention output projection written transposed."""

    def to_hf(self, full: Any) -> dict[str, Any]:
        if self.megatron.endswith("[1]") and "linear_proj" in self.megatron:
            assert full.shape[0] == full.shape[1], "the bug needs a square matrix"
            full = full.t().contiguous()
        return super().to_hf(full)


@pytest.mark.parametrize(
    "kind,bug,layer",
    [(SplitKind.QKV, SwappedGroupsQKV, "layer 2"), (SplitKind.ROW, TransposedRow, "layer 1")],
    ids=["swapped-qk-groups", "transposed-square"],
)
def test_wrong_mapping_fails_verify_naming_the_layer(tiny_tp2: Trained, kind: SplitKind, bug: type, layer: str) -> None:
    doc = json.loads((tiny_tp2.workdir / tiny_tp2.build / "convert" / "mapping.json").read_text())
    step = latest_checkpoint(tiny_tp2.workdir / doc["checkpoint_dir"])
    wrong = tiny_tp2.workdir / f"wrong_{kind.value}"
    convert_megatron(doc, step / DIST_CKPT_DIR, wrong, classes={**TRANSFORMS, kind: bug})
    code, report, err = verify_report(tiny_tp2, wrong)
    assert code == 1
    assert report["ok"] is False
    assert report["first_diverging"] == layer
    assert f"first diverging: {layer}" in err
    earlier = [name for name in report["layers"] if name < layer]
    assert all(report["layers"][name] > 0.999 for name in earlier)
