"""convert/mapping.json reads well in review: header keys indented, one tensor per line."""

from __future__ import annotations

import json
from pathlib import Path

from lmspec.compiler.build.files import MAPPING
from lmspec.compiler.emit.conversion import emit_conversion, mapping_document
from lmspec.compiler.emit.spec_files import dump_json
from lmspec.compiler.pipeline import make_plan


def test_one_line_per_tensor_and_the_same_document() -> None:
    plan = make_plan([], Path("deepseek_v3_pretrain_2048gpu_h800_bf16"))
    text = emit_conversion(plan)[MAPPING]
    doc = mapping_document(plan)
    assert json.loads(text) == json.loads(dump_json(doc))
    rows = [line for line in text.splitlines() if line.startswith("    {")]
    assert len(rows) == len(doc["tensors"]) > 900
    assert [json.loads(row.rstrip(",")) for row in rows] == doc["tensors"]


def test_a_spec_change_touches_only_the_rows_it_changes() -> None:
    before = emit_conversion(make_plan(["convert.dtype=float32"]))[MAPPING].splitlines()
    after = emit_conversion(make_plan(["convert.dtype=bfloat16"]))[MAPPING].splitlines()
    changed = [b for a, b in zip(before, after) if a != b]
    assert len(before) == len(after) and changed
    assert all('"hf_dtype": "bfloat16"' in line or '"torch_dtype"' in line for line in changed)
