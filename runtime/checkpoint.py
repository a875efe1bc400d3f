"""Crash-safe checkpoints: temp dir, fsync, sha256 manifest, rename, then `latest`.

Layout under `train.checkpoint.dir` (relative to the working directory):

    latest                     one line: the newest COMPLETE step directory, e.g. "step_20"
    step_<N>/                  one complete checkpoint (N = optimizer steps done)
      manifest.json            {"step": N, "files": {relative path: sha256}} - written last
      trainer_state/rank_<R>.pt  per global rank: step, consumed_samples, LR scheduler
                               state, RNG states (python, torch CPU/CUDA, megatron tracker)
      megatron backend:
        torch_dist/            megatron-core dist_checkpointing (torch_dist format):
                               .metadata, __<R>_<S>.distcp, common.pt, metadata.json;
                               {"model": GPTModel.sharded_state_dict(), "optimizer":
                               optimizer.sharded_state_dict(...)}: model keys are
                               megatron's global names (embedding.word_embeddings.weight,
                               decoder.layers.self_attention.linear_qkv.weight with the
                               layers stacked on a leading axis, decoder.final_layernorm.weight,
                               output_layer.weight); loads into any TP/PP (resharding).
                               Read it back with runtime.megatron_model.build_model +
                               dist_checkpointing.load(model.sharded_state_dict(), dir).
      deepspeed backend:
        deepspeed/             DeepSpeed's save_checkpoint layout: latest, <tag>/
                               zero_pp_rank_R_mp_rank_00_{model,optim}_states.pt
    .tmp-step_<N>/             a save in progress (never read; removed by the next save)

A save writes everything into `.tmp-step_<N>`, fsyncs every file, writes the
manifest, renames the directory to `step_<N>` and only then rewrites `latest`
(write `latest.tmp`, fsync, rename). A process killed at any point leaves either
the previous `latest` or the new one, never a pointer to a partial directory.
Only the last `keep_last_k` complete checkpoints are kept.

Resume (`train.checkpoint.resume: auto`): candidates are `latest`, then every
other `step_<N>` newest first; the first whose manifest exists and whose files
all match their sha256 is used. A corrupt or partial one is skipped with a
warning naming the file. When step directories exist but none verifies, the run
stops with an error instead of silently starting from scratch.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
from pathlib import Path

import torch.distributed as dist

LATEST = "latest"
MANIFEST = "manifest.json"
_STEP_DIR = re.compile(r"^step_(\d+)$")
_CHUNK_BYTES = 1 << 20


class CheckpointError(RuntimeError):
    """Checkpoints exist but none can be used: the run must not start from scratch."""


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(_CHUNK_BYTES), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            with open(Path(dirpath) / name, "rb") as fh:
                os.fsync(fh.fileno())
        _fsync_dir(Path(dirpath))


def _files(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file() and p.name != MANIFEST)


def step_dirs(root: Path) -> list[tuple[int, Path]]:
    """Complete-looking step directories, newest first."""
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _STEP_DIR.match(p.name)) and p.is_dir()]
    return sorted(found, reverse=True)


def verify(step_dir: Path) -> str | None:
    """None when every file of the manifest is present and matches; otherwise why not."""
    manifest_path = step_dir / MANIFEST
    if not manifest_path.is_file():
        return f"{manifest_path} is missing (the save did not finish)"
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return f"{manifest_path} is unreadable: {exc}"
    for rel, expected in manifest["files"].items():
        path = step_dir / rel
        if not path.is_file():
            return f"{path} is missing"
        if sha256_file(path) != expected:
            return f"{path} does not match its sha256 in {MANIFEST}"
    return None


def _is_rank0() -> bool:
    return not dist.is_initialized() or dist.get_rank() == 0


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def _broadcast(value: object) -> object:
    if not dist.is_initialized():
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def warn(message: str) -> None:
    print(f"lmspec: warning: {message}", file=sys.stderr, flush=True)


class Checkpoints:
    """Save and find checkpoints under one directory; every rank calls every method."""

    def __init__(self, root: Path, keep_last_k: int) -> None:
        self.root = root
        self.keep_last_k = keep_last_k

    def begin_save(self, step: int) -> Path:
        """A fresh temp directory for step `step` (rank 0 creates it; all ranks wait)."""
        tmp = self.root / f".tmp-step_{step}"
        if _is_rank0():
            self.root.mkdir(parents=True, exist_ok=True)
            for stale in self.root.glob(".tmp-step_*"):
                shutil.rmtree(stale, ignore_errors=True)
            tmp.mkdir()
        _barrier()
        return tmp

    def commit(self, step: int, tmp: Path) -> Path:
        """After every rank wrote into `tmp`: manifest, rename, `latest`, prune."""
        _barrier()
        final = self.root / f"step_{step}"
        if _is_rank0():
            _fsync_tree(tmp)
            manifest = {"step": step, "files": {rel: sha256_file(tmp / rel) for rel in _files(tmp)}}
            manifest_path = tmp / MANIFEST
            with open(manifest_path, "w", encoding="utf-8") as fh:
                json.dump(manifest, fh, indent=2, sort_keys=True)
                fh.flush()
                os.fsync(fh.fileno())
            _fsync_dir(tmp)
            if final.exists():
                shutil.rmtree(final)
            os.rename(tmp, final)
            _fsync_dir(self.root)
            pointer = self.root / f"{LATEST}.tmp"
            with open(pointer, "w", encoding="utf-8") as fh:
                fh.write(f"{final.name}\n")
                fh.flush()
                os.fsync(fh.fileno())
            os.rename(pointer, self.root / LATEST)
            _fsync_dir(self.root)
            for _, old in step_dirs(self.root)[self.keep_last_k :]:
                shutil.rmtree(old, ignore_errors=True)
        _barrier()
        return final

    def find_resumable(self) -> Path | None:
        """The newest verified checkpoint (rank 0 decides, every rank gets the same answer)."""
        chosen: str | None = None
        problem: str | None = None
        if _is_rank0():
            chosen, problem = self._pick()
        chosen, problem = _broadcast((chosen, problem))  # type: ignore[misc]
        if problem is not None:
            raise CheckpointError(problem)
        return None if chosen is None else Path(chosen)

    def _pick(self) -> tuple[str | None, str | None]:
        candidates = step_dirs(self.root)
        if not candidates:
            return None, None
        latest_file = self.root / LATEST
        ordered = [p for _, p in candidates]
        if latest_file.is_file():
            named = self.root / latest_file.read_text(encoding="utf-8").strip()
            if named in ordered:
                ordered.remove(named)
                ordered.insert(0, named)
        for path in ordered:
            reason = verify(path)
            if reason is None:
                return str(path), None
            warn(f"checkpoint {path.name} is not usable ({reason}); trying an older one")
        return None, (
            f"checkpoints exist under {self.root} but none verifies; refusing to start from "
            f"scratch: remove {self.root} or set train.checkpoint.resume=never"
        )
