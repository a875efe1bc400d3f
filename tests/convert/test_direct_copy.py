"""The direct path (checkpoint bytes copied file to file by row bands) writes exactly what the
buffered path (tensors assembled, `to_hf`, written) writes, on real trained TP=2 checkpoints.

tiny at TP=2 has GQA (8 heads in 2 kv groups: the per-group q/k/v row blocks), a gated MLP
(gate/up halves of both TP ranks), row-parallel o_proj and down_proj (one piece per row and
rank) and column-parallel embedding and head; tiny_moe at TP=2 + EP=2 adds MLA projections and
experts from both EP ranks. Both paths run here on the same checkpoint; the output files must
be byte-identical. Seconds on top of the session's training fixtures.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from helpers.convert import Trained, run

from lmspec.compiler.build.files import DIST_CKPT_DIR
from lmspec.runtime.convert.to_hf import convert_megatron, latest_checkpoint

pytestmark = pytest.mark.slow


def files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


@pytest.mark.parametrize("fixture", ["tiny_tp2", "tiny_moe_tp2_ep2"])
def test_direct_copy_matches_the_buffered_path_byte_for_byte(
    fixture: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    trained: Trained = request.getfixturevalue(fixture)
    doc = json.loads((trained.workdir / trained.build / "convert" / "mapping.json").read_text())
    step = latest_checkpoint(trained.workdir / doc["checkpoint_dir"]) / DIST_CKPT_DIR
    direct = convert_megatron(doc, step, tmp_path / "direct")
    buffered = convert_megatron(doc, step, tmp_path / "buffered", direct=False)
    assert buffered["megatron_tensors_direct"] == 0
    assert direct["megatron_tensors_buffered"] == 0  # fp32 -> fp32: every tensor copied by bytes
    assert direct["megatron_tensors_direct"] == buffered["megatron_tensors_buffered"] > 0
    kinds = {entry["kind"] for entry in doc["tensors"]}
    assert {"qkv", "gated_mlp", "row", "column"} <= kinds or {"mla_up", "row", "column"} <= kinds
    assert files(tmp_path / "direct") == files(tmp_path / "buffered")


def test_small_shards_and_a_cast_take_both_paths_into_the_same_files(tiny_tp2: Trained, tmp_path: Path) -> None:
    """Tensors cast to bfloat16 go through the buffered path, the rest direct, across many shards."""
    doc = json.loads((tiny_tp2.workdir / tiny_tp2.build / "convert" / "mapping.json").read_text())
    for entry in doc["tensors"]:
        if entry["kind"] in ("qkv", "row"):
            entry["hf_dtype"] = "bfloat16"
    step = latest_checkpoint(tiny_tp2.workdir / doc["checkpoint_dir"]) / DIST_CKPT_DIR
    small = 64 * 1024
    mixed = convert_megatron(doc, step, tmp_path / "mixed", max_shard_bytes=small)
    buffered = convert_megatron(doc, step, tmp_path / "buffered", max_shard_bytes=small, direct=False)
    assert mixed["megatron_tensors_direct"] > 0 and mixed["megatron_tensors_buffered"] > 0
    assert mixed["shards"] == buffered["shards"] > 2
    assert files(tmp_path / "mixed") == files(tmp_path / "buffered")


@pytest.mark.parametrize("fixture", ["tiny_tp2", "tiny_moe_tp2_ep2"])
def test_inert_metadata_reader_agrees_with_torch(fixture: str, request: pytest.FixtureRequest) -> None:
    from lmspec.runtime.convert.dist_metadata import read_inert, read_with_torch

    trained: Trained = request.getfixturevalue(fixture)
    doc = json.loads((trained.workdir / trained.build / "convert" / "mapping.json").read_text())
    step = latest_checkpoint(trained.workdir / doc["checkpoint_dir"]) / DIST_CKPT_DIR
    inert = read_inert(step)
    assert inert == read_with_torch(step)
    assert inert.tensors and all(len(info.relative_path) for info in inert.storage.values())


def test_the_direct_path_imports_no_torch(tiny_tp2: Trained, tmp_path: Path) -> None:
    """Importing torch costs ~1.9 s with torch.distributed.checkpoint, more than converting 2 GB directly."""
    script = (
        "import json, sys; from pathlib import Path; "
        "from lmspec.runtime.convert.to_hf import convert_megatron, latest_checkpoint; "
        "from lmspec.compiler.build.files import DIST_CKPT_DIR; "
        "doc = json.loads(Path(sys.argv[1]).read_text()); "
        "s = convert_megatron(doc, latest_checkpoint(Path(doc['checkpoint_dir'])) / DIST_CKPT_DIR, Path(sys.argv[2])); "
        "print(json.dumps({'torch': [m for m in sys.modules if m == 'torch'], **s}))"
    )
    result = run(
        [sys.executable, "-c", script, str(tiny_tp2.build / "convert" / "mapping.json"), str(tmp_path / "hf")],
        tiny_tp2.workdir,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["torch"] == [] and summary["megatron_tensors_buffered"] == 0
