"""`train.init_from`: is the checkpoint it names one this run can start from?

Twice, so that a wrong path costs no allocation and a wrong model no traceback:
- `init_from_problems`, before any worker starts (`lmspec run`) and before the ranks meet (the
  entry point): the directory is a complete step directory lmspec wrote (its manifest lists files that
  are all there; lmspec.runtime.train.checkpoint.verify, without hashing: loading reads every byte,
  as convert does) holding a checkpoint of this build's backend (TrainingBackend.checkpoint_dir: megatron's
  torch_dist/, torchtitan's torchtitan/ DCP), whose index is DCP's .metadata in both.
- `require_model_tensors` (megatron) and `require_stored_shapes` (any), after the model is built and before
  it loads: the checkpoint stores every tensor of this model under its global key with its global shape
  (dist_checkpointing and DCP reshard any layout, but cannot load another model).
Each failure names train.init_from, what is wrong and the fix.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lmspec.compiler.backends import BACKENDS, backend_of
from lmspec.compiler.build.files import STEP_MANIFEST
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
    backend = backend_of(spec)
    fix = f"point it at a step_<N> directory of a {backend.name} run's train.checkpoint.dir, or set it to null"
    if not path.exists():
        return [error(KEY, f"{shown}: no such directory (from {Path.cwd()}); train the source run first, or {fix}")]
    why = verify(path, required=(f"{backend.checkpoint_dir}/{METADATA_FILE}",), hashes=False)
    if why is not None:
        if not (path / STEP_MANIFEST).is_file() or (path / backend.checkpoint_dir).is_dir():
            what = "not a complete checkpoint step directory lmspec wrote"
        else:
            saved = [b.name for b in BACKENDS.values() if (path / b.checkpoint_dir).is_dir()]
            what = f"not a {backend.name} checkpoint (no {backend.checkpoint_dir}/; " + (
                f"a {saved[0]} run's: convert it to HF with --stage convert and import that with --stage import)"
                if saved
                else "a checkpoint of another backend?)"
            )
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

    stored = {key: tuple(md.shape) for key, md in read_metadata(ckpt_dir).tensors.items()}
    shapes: dict[str, tuple[int, ...] | None] = {}
    for item in nested_values(wanted):
        if isinstance(item, ShardedTensorFactory):  # stored under its key; its shape is its build_fn's
            shapes[item.key] = None
        elif isinstance(item, ShardedTensor):
            shapes[item.key] = tuple(item.global_shape)
    require_stored_shapes(ckpt_dir, stored, shapes)


def require_stored_shapes(
    ckpt_dir: Path, stored: Mapping[str, tuple[int, ...]], wanted: Mapping[str, tuple[int, ...] | None]
) -> None:
    """CheckpointError unless the checkpoint in `ckpt_dir` (a step directory's backend directory), which
    stores `stored` (key -> global shape), holds every key of `wanted` with its shape (None: any shape)."""
    missing = [key for key in wanted if key not in stored]
    reshaped = [
        f"{key} is {list(stored[key])} there, {list(shape)} here"
        for key, shape in wanted.items()
        if key in stored and shape is not None and tuple(stored[key]) != tuple(shape)
    ]
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
