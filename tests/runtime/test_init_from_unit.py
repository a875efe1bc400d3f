"""train.init_from's checks in one process: the preflight on the directory (lmspec.runtime.train.init_from),
and the model check against a real torch_dist `.metadata` (torch.distributed.checkpoint, no process group)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from lmspec.compiler.build.files import DIST_CKPT_DIR
from lmspec.compiler.pipeline import make_plan
from lmspec.runtime.train.checkpoint import CheckpointError, Checkpoints
from lmspec.runtime.train.init_from import init_from_problems, require_model_tensors

EMBEDDING = "embedding.word_embeddings.weight"


def _step_dir(root: Path, tensors: dict[str, torch.Tensor] | None, other: str | None = None) -> Path:
    """A step directory as the checkpoint writer commits it: a torch_dist checkpoint of `tensors`,
    or only the file `other` (a deepspeed run's)."""
    import torch.distributed.checkpoint as dcp

    ckpts = Checkpoints(root, keep_last_k=2)
    tmp = ckpts.begin_save(2)
    if tensors is not None:
        dcp.save(tensors, checkpoint_id=str(tmp / DIST_CKPT_DIR), no_dist=True)
    if other is not None:
        (tmp / other).parent.mkdir(parents=True)
        (tmp / other).write_bytes(b"states")
    return ckpts.commit(2, tmp)


def _messages(tmp_path: Path, init_from: str, *overrides: str) -> list[str]:
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        spec = make_plan([f"train.init_from={init_from}", *overrides], None).spec
        return [p.message for p in init_from_problems(spec)]
    finally:
        os.chdir(cwd)


def test_a_megatron_step_directory_passes(tmp_path: Path) -> None:
    _step_dir(tmp_path / "src", {EMBEDDING: torch.zeros(8, 4)})
    assert _messages(tmp_path, "src/step_2") == []


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        pytest.param(None, "src/step_2': no such directory", id="missing"),
        pytest.param("plain", "is not a complete checkpoint step directory lmspec wrote", id="not-lmspec"),
        pytest.param("deepspeed", "is not a megatron checkpoint (no torch_dist/", id="deepspeed"),
    ],
)
def test_a_directory_that_cannot_be_loaded_is_named_with_the_fix(
    tmp_path: Path, make: str | None, expected: str
) -> None:
    if make == "plain":
        (tmp_path / "src" / "step_2" / DIST_CKPT_DIR).mkdir(parents=True)
    elif make == "deepspeed":
        _step_dir(tmp_path / "src", None, other="deepspeed/step/mp_rank_00_model_states.pt")
    messages = _messages(tmp_path, "src/step_2")
    assert len(messages) == 1 and expected in messages[0], messages
    assert "train.init_from='src/step_2'" in messages[0] and "or set it to null" in messages[0]


def test_a_torchtitan_build_names_the_way_across_from_a_megatron_step_directory(tmp_path: Path) -> None:
    """torchtitan reads its own DCP save; a megatron checkpoint reaches it through HF (convert, then import)."""
    _step_dir(tmp_path / "src", {EMBEDDING: torch.zeros(8, 4)})
    messages = _messages(tmp_path, "src/step_2", "train.backend=torchtitan", "parallel.zero_stage=3")
    assert len(messages) == 1, messages
    assert "is not a torchtitan checkpoint (no torchtitan/; a megatron run's: convert it to HF" in messages[0]
    assert "--stage import" in messages[0]


def test_another_models_checkpoint_is_refused_naming_the_tensors(tmp_path: Path) -> None:
    from megatron.core.dist_checkpointing.mapping import ShardedTensor

    step = _step_dir(tmp_path / "src", {EMBEDDING: torch.zeros(8, 4)})
    same = {"model": {EMBEDDING: ShardedTensor.from_rank_offsets(EMBEDDING, torch.zeros(8, 4))}}
    require_model_tensors(step / DIST_CKPT_DIR, same)
    wider = {"model0": {EMBEDDING: ShardedTensor.from_rank_offsets(EMBEDDING, torch.zeros(8, 6))}}
    with pytest.raises(CheckpointError, match=r"embedding.word_embeddings.weight is \[8, 4\] there, \[8, 6\] here"):
        require_model_tensors(step / DIST_CKPT_DIR, wider)
    head = "output_layer.weight"
    more = {"model1": {head: ShardedTensor.from_rank_offsets(head, torch.zeros(8, 4))}}
    with pytest.raises(CheckpointError, match="is a checkpoint of another model: it holds no output_layer.weight"):
        require_model_tensors(step / DIST_CKPT_DIR, more)
