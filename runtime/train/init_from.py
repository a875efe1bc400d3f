"""`train.init_from`: is the checkpoint it names one this run can start from?

Twice, so that a wrong path costs no allocation and a wrong model no traceback:
- `init_from_problems`, before any worker starts (`lmspec run`) and before the ranks meet (the
  entry point): the directory is a complete step directory lmspec wrote (its manifest lists files that
  are all there; lmspec.runtime.train.checkpoint.verify, without hashing: loading reads every byte,
  as convert does) holding a megatron torch_dist checkpoint.
- `require_model_tensors`, after the model is built and before it loads: the checkpoint stores every
  tensor of this model under its global key with its global shape (dist_checkpointing reshards any
  TP/PP/EP/virtual-stage layout, but cannot load another model).
Each failure names train.init_from, what is wrong and the fix.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from lmspec.compiler.build.files import DIST_CKPT_DIR, STEP_MANIFEST
from lmspec.compiler.errors import Problem, error, print_problems
from lmspec.compiler.spec.sections import TrainingSpec
from lmspec.runtime.convert.dist_metadata import METADATA_FILE, read_metadata
from lmspec.runtime.train.checkpoint import CheckpointError, verify

logger = logging.getLogger(__name__)

KEY = "train.init_from"
_SHOWN_TENSORS = 3  # mismatching tensors named in a message


def init_from_problems(spec: TrainingSpec) -> list[Problem]:
    """Why `train.init_from` cannot be loaded, from this working directory; [] when it can (or is null)."""
    start = spec.train.init_from
    if start is None:
        return []
    path = Path(start)
    shown = f"{KEY}={start!r}"
    fix = "point it at a step_<N> directory of a megatron run's train.checkpoint.dir, or set it to null"
    if not path.exists():
        return [error(KEY, f"{shown}: no such directory (from {Path.cwd()}); train the source run first, or {fix}")]
    why = verify(path, required=(f"{DIST_CKPT_DIR}/{METADATA_FILE}",), hashes=False)
    if why is not None:
        if not (path / STEP_MANIFEST).is_file() or (path / DIST_CKPT_DIR).is_dir():
            what = "not a complete checkpoint step directory lmspec wrote"
        else:
            what = f"not a megatron checkpoint (no {DIST_CKPT_DIR}/; a deepspeed run's checkpoint?)"
        return [error(KEY, f"{shown} is {what}: {why}; {fix}")]
    return []


def init_from_ready(spec: TrainingSpec, *, report: bool = True) -> bool:
    """Print `init_from_problems` (when `report`); False when there is any."""
    problems = init_from_problems(spec)
    if problems and report:
        print_problems(problems)
        logger.error(f"lmspec run: {KEY} cannot be loaded; nothing was started or written")
    return not problems


def require_model_tensors(ckpt_dir: Path, wanted: dict[str, Any]) -> None:
    """CheckpointError unless torch_dist `ckpt_dir` stores every tensor of the sharded state dict `wanted`
    (this rank's model chunks) with the same global shape."""
    from megatron.core.dist_checkpointing.dict_utils import nested_values
    from megatron.core.dist_checkpointing.mapping import ShardedTensor, ShardedTensorFactory

    stored = read_metadata(ckpt_dir).tensors
    missing: list[str] = []
    reshaped: list[str] = []
    for item in nested_values(wanted):
        if isinstance(item, ShardedTensorFactory):  # stored under its key; its shape is its build_fn's
            if item.key not in stored:
                missing.append(item.key)
        elif isinstance(item, ShardedTensor):
            if item.key not in stored:
                missing.append(item.key)
            elif tuple(stored[item.key].shape) != tuple(item.global_shape):
                reshaped.append(f"{item.key} is {list(stored[item.key].shape)} there, {list(item.global_shape)} here")
    if not (missing or reshaped):
        return
    parts = []
    if missing:
        parts.append(f"it holds no {', '.join(sorted(set(missing))[:_SHOWN_TENSORS])}")
    if reshaped:
        parts.append("; ".join(reshaped[:_SHOWN_TENSORS]))
    raise CheckpointError(
        f"{KEY}={str(ckpt_dir.parent)!r} is a checkpoint of another model: {'; '.join(parts)}; "
        "initialise from a checkpoint of this spec's model (same model.* keys), or set train.init_from=null"
    )
