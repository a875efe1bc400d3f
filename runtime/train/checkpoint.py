"""Crash-safe checkpoints owned by the run that wrote them: temp dir, fsync, sha256 manifest, rename, `latest`.

Layout under `train.checkpoint.dir` (relative to the working directory):

    latest                     one line: the newest COMPLETE step directory, e.g. "step_20"
    step_<N>/                  one complete checkpoint (N = optimizer steps done)
      manifest.json            {"step": N, "run_id": "<32 hex>", "files": {relative path: sha256}}
                               - written last
      trainer_state/rank_<R>.pt  per global rank: step, consumed_samples, LR scheduler
                               state, RNG states (python, torch CPU/CUDA, megatron tracker)
      megatron backend:
        torch_dist/            megatron-core dist_checkpointing (torch_dist format):
                               .metadata, __<R>_<S>.distcp, common.pt, metadata.json;
                               {"model": GPTModel.sharded_state_dict(), "optimizer":
                               optimizer.sharded_state_dict(...)}, "model0", "model1", ...
                               for the chunks of interleaved 1F1B: tensor keys are
                               megatron's global names (embedding.word_embeddings.weight,
                               decoder.layers.self_attention.linear_qkv.weight with the
                               layers stacked on a leading axis, decoder.final_layernorm.weight,
                               output_layer.weight); loads into any TP/PP/EP/virtual
                               stages (resharding), and train.init_from reads its model part.
                               Read it back with lmspec.runtime.train.megatron.model.build_model +
                               dist_checkpointing.load(model.sharded_state_dict(), dir).
      deepspeed backend:
        deepspeed/             DeepSpeed's save_checkpoint layout: latest, <tag>/
                               zero_pp_rank_R_mp_rank_00_{model,optim}_states.pt
    .tmp-step_<N>/             a save in progress (never read; removed by the next save)
    previous_runs/<run id>/    checkpoints of earlier runs, moved aside (see below); never read

A save writes everything into `.tmp-step_<N>`, fsyncs every file, writes the
manifest, renames the directory to `step_<N>` and only then rewrites `latest`
(write `latest.tmp`, fsync, rename). A process killed at any point leaves either
the previous `latest` or the new one, never a pointer to a partial directory.

Run identity. Every run has a run id: a fresh uuid4 when it starts from scratch, the id in the
manifest of the checkpoint it resumes from otherwise (so a run keeps its id across any number of
resumes). It is written into every step's manifest (the directory's run is the one of `latest`'s
step: `dir_run_id`; no separate file, so the directory holds only what it always did). `keep_last_k` prunes
only the current run's checkpoints (a manifest without a run id, written before run ids
existed, counts as the current run's only when the run resumed from one); a step directory of
another run that stands where a save of this run goes is moved aside, not deleted.

`train.checkpoint.resume: never` starts a fresh run: before anything is written, every entry
lmspec made in the checkpoint directory (`latest`, `step_<N>`, `.tmp-step_<N>`) is
MOVED into `previous_runs/<old run id>/` (`previous_runs/unidentified/` when no id can be read;
`-2`, `-3`... when that name is taken), with a warning naming it. Nothing is deleted: removing
it is the user's call. Other files in the directory are left where they are. Moving (a rename
inside the same directory) is chosen over refusing because `resume=never` is what lmspec itself
recommends when checkpoints are unusable; it costs no copy.

Resume (`train.checkpoint.resume: auto`): candidates are the step named by `latest`, then every
other `step_<N>` newest first; the first whose manifest is well-formed (an object with the
directory's step, a files map of safe relative paths to sha256 digests, and the files the trainer
needs) and whose files all match is used. Anything damaged - a `latest` that is not a short text
file naming an existing step, a manifest that is not such an object, a listed path outside the
step directory, a step entry that is not a directory - is skipped with a one-line warning naming
the file. When checkpoints exist but none verifies, the run stops with an error instead of
silently starting from scratch.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import stat
import uuid
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Literal, TypeVar

from lmspec.compiler.build.atomic import replace_file
from lmspec.compiler.build.digest import sha256_file
from lmspec.compiler.build.files import (
    LATEST,
    LATEST_TEMP,
    PREVIOUS_RUNS,
    STEP_MANIFEST,
    STEP_PREFIX,
    step_dir,
    step_number,
)

logger = logging.getLogger(__name__)

UNIDENTIFIED = "unidentified"
TMP_PREFIX = f".tmp-{STEP_PREFIX}"
_RUN_ID = re.compile(r"[0-9a-f]{32}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_LATEST_MAX_BYTES = 256  # "step_<N>\n" with N of any size a run can reach
_MANIFEST_MAX_BYTES = 64 << 20  # a million listed files; lmspec writes a few per rank
_SHOWN = 60  # characters of a damaged value quoted in a warning

Resume = Literal["auto", "never"]


class CheckpointError(RuntimeError):
    """Checkpoints exist but none can be used: the run must not start from scratch."""


def new_run_id() -> str:
    return uuid.uuid4().hex


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
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file() and p.name != STEP_MANIFEST)


def _cut_repr(value: object) -> str:
    """A damaged value for a one-line message: repr (no raw newlines or control bytes), cut short."""
    text = repr(value)
    return text if len(text) <= _SHOWN else f"{text[:_SHOWN]}...(cut)"


def step_entries(root: Path) -> list[tuple[int, Path]]:
    """Every entry named `step_<N>` (directory or not), newest first."""
    if not root.is_dir():
        return []
    found = [(n, p) for p in root.iterdir() if (n := step_number(p.name)) is not None]
    return sorted(found, reverse=True)


def step_dirs(root: Path) -> list[tuple[int, Path]]:
    """Step directories (real directories, not symlinks), newest first."""
    return [(n, p) for n, p in step_entries(root) if p.is_dir() and not p.is_symlink()]


def _not_a_step_dir(path: Path) -> str | None:
    """Why a `step_<N>` entry is not a checkpoint directory lmspec wrote, or None."""
    try:
        info = path.lstat()
    except OSError as exc:
        return f"{path} cannot be read: {exc.strerror}"
    if stat.S_ISLNK(info.st_mode):
        return f"{path} is a symlink, not a step directory lmspec wrote"
    if not stat.S_ISDIR(info.st_mode):
        return f"{path} is not a directory"
    return None


def read_latest(root: Path) -> tuple[str | None, str | None]:
    """(the step name `latest` holds, why it is not usable): one of them is None; (None, None) when absent."""
    path = root / LATEST
    try:
        info = path.lstat()
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, f"{path} cannot be read: {exc.strerror}"
    if stat.S_ISLNK(info.st_mode):
        return None, f"{path} is a symlink, not the pointer lmspec writes"
    if not stat.S_ISREG(info.st_mode):
        return None, f"{path} is not a regular file"
    if info.st_size > _LATEST_MAX_BYTES:
        return None, f"{path} is {info.st_size} bytes, not a step name"
    try:
        with open(path, "rb") as fh:
            raw = fh.read(_LATEST_MAX_BYTES + 1)
    except OSError as exc:
        return None, f"{path} cannot be read: {exc.strerror}"
    try:
        name = raw.decode("ascii").strip()
    except UnicodeDecodeError:
        return None, f"{path} is not text (holds {_cut_repr(raw)})"
    if step_number(name) is None:
        return None, f"{path} holds {_cut_repr(name)}, not a step name like step_20"
    return name, None


@dataclass(frozen=True)
class Manifest:
    step: int
    run_id: str | None  # None: written before run ids existed
    files: dict[str, str]


def _unsafe_path(rel: str) -> str | None:
    """Why a path listed in a manifest may not be read, or None: it must stay inside the step directory."""
    if not rel or any(ord(c) < 32 or c == "\\" for c in rel):
        return "is not a plain relative path"
    pure = PurePosixPath(rel)
    if pure.is_absolute() or any(part in ("", ".", "..") for part in rel.split("/")):
        return "points outside the step directory"
    if rel == STEP_MANIFEST:
        return "is the manifest itself"
    return None


def read_manifest(step_dir: Path) -> tuple[Manifest | None, str | None]:
    """The step directory's manifest, or why it is not usable (one line naming the file)."""
    path = step_dir / STEP_MANIFEST
    try:
        info = path.lstat()
    except FileNotFoundError:
        return None, f"{path} is missing (the save did not finish)"
    except OSError as exc:
        return None, f"{path} cannot be read: {exc.strerror}"
    if not stat.S_ISREG(info.st_mode):
        return None, f"{path} is not a regular file"
    if info.st_size > _MANIFEST_MAX_BYTES:
        return None, f"{path} is {info.st_size} bytes, larger than any manifest lmspec writes"
    try:
        with open(path, "rb") as fh:
            raw = fh.read(_MANIFEST_MAX_BYTES + 1)
        doc = json.loads(raw.decode("utf-8"))
    except OSError as exc:
        return None, f"{path} cannot be read: {exc.strerror}"
    except UnicodeDecodeError:
        return None, f"{path} is not UTF-8 text"
    except (ValueError, RecursionError) as exc:
        return None, f"{path} is not JSON ({exc})"  # json's messages are one bounded line
    return _parse_manifest(doc, step_dir, path)


def _parse_manifest(doc: Any, step_dir: Path, path: Path) -> tuple[Manifest | None, str | None]:
    if not isinstance(doc, dict):
        return None, f"{path} holds a JSON {type(doc).__name__}, not an object"
    missing = [key for key in ("step", "files") if key not in doc]
    if missing:
        return None, f"{path} lacks {', '.join(repr(k) for k in missing)}"
    step, files, run_id = doc["step"], doc["files"], doc.get("run_id")
    if type(step) is not int:
        return None, f"{path}: 'step' is {_cut_repr(step)}, not an integer"
    if step != step_number(step_dir.name):
        return None, f"{path}: 'step' is {step} but the directory is {step_dir.name}"
    if run_id is not None and not (isinstance(run_id, str) and _RUN_ID.fullmatch(run_id)):
        return None, f"{path}: 'run_id' is {_cut_repr(run_id)}, not a run id"
    if not isinstance(files, dict) or not files:
        return None, f"{path}: 'files' is {_cut_repr(files)}, not a map of the step's files"
    for rel, digest in files.items():
        if not isinstance(digest, str) or not _SHA256.fullmatch(digest):
            return None, f"{path}: the sha256 of {_cut_repr(rel)} is {_cut_repr(digest)}"
        if (why := _unsafe_path(rel)) is not None:
            return None, f"{path} lists {_cut_repr(rel)}, which {why}"
    return Manifest(step, run_id, dict(files)), None


def verify(step_dir: Path, required: tuple[str, ...] = (), hashes: bool = True) -> str | None:
    """None when the manifest is well-formed, lists `required`, and every file it lists is there (and, with
    `hashes`, matches its sha256)."""
    if (why := _not_a_step_dir(step_dir)) is not None:
        return why
    manifest, why = read_manifest(step_dir)
    if manifest is None:
        return why
    absent = [rel for rel in required if rel not in manifest.files]
    if absent:
        return f"{step_dir / STEP_MANIFEST} does not list {', '.join(absent)}"
    inside = os.path.realpath(step_dir)
    for rel, expected in manifest.files.items():
        path = step_dir / rel
        if not os.path.realpath(path).startswith(inside + os.sep):
            return f"{path} leads outside {step_dir} (a symlink)"
        try:
            info = path.stat()
        except FileNotFoundError:
            return f"{path} is missing"
        except OSError as exc:
            return f"{path} cannot be read: {exc.strerror}"
        if not stat.S_ISREG(info.st_mode):
            return f"{path} is not a regular file"
        if hashes and sha256_file(path) != expected:
            return f"{path} does not match its sha256 in {STEP_MANIFEST}"
    return None


@dataclass
class Choice:
    """What resume would load: `path` (None = start fresh), the run it belongs to, the warnings on the way,
    and `error` when checkpoints exist but none is usable."""

    path: Path | None = None
    run_id: str | None = None
    legacy: bool = False  # the chosen manifest has no run id
    warnings: list[str] = field(default_factory=list)
    error: str | None = None


def choose(root: Path, required: tuple[str, ...] = (), hashes: bool = True) -> Choice:
    """The resume candidate: `latest`'s step, then every other step newest first; the first that verifies."""
    choice = Choice()
    if not os.path.lexists(root):
        return choice
    if not root.is_dir():
        choice.error = (
            f"train.checkpoint.dir={str(root)!r} is not a directory; move it away or compile with another "
            "train.checkpoint.dir"
        )
        return choice
    entries = step_entries(root)
    ordered = [p for _, p in entries]
    named, why = read_latest(root)
    if why is not None:
        choice.warnings.append(f"{why}; trying the step directories newest first")
    elif named is not None:
        if root / named in ordered:
            ordered.remove(root / named)
            ordered.insert(0, root / named)
        else:
            choice.warnings.append(f"{root / LATEST} names {named}, which does not exist; trying the others")
    for i, path in enumerate(ordered):
        reason = verify(path, required, hashes)
        if reason is None:
            manifest, _ = read_manifest(path)
            assert manifest is not None  # verified just now
            choice.path, choice.run_id, choice.legacy = path, manifest.run_id, manifest.run_id is None
            return choice
        following = f"trying {ordered[i + 1].name}" if i + 1 < len(ordered) else "no other checkpoint is left"
        choice.warnings.append(f"checkpoint {path.name} is not usable ({reason}); {following}")
    if entries or named is not None or why is not None:
        choice.error = (
            f"checkpoints exist under {root} but none verifies; refusing to start from scratch: fix or remove "
            f"them, or set train.checkpoint.resume=never to start a fresh run (lmspec moves them aside into "
            f"{root / PREVIOUS_RUNS}/, deleting nothing)"
        )
    return choice


def newest_checkpoint(root: Path, required: tuple[str, ...] = ()) -> Path:
    """The checkpoint a later stage (convert, verify) reads: what resume would load, warnings printed.

    Its files are checked to be there, not hashed: a conversion reads every byte once (hashing first
    would double its I/O, bench/convert_throughput.py), and `verify` compares logits afterwards.

    Raises CheckpointError when there is none, naming the directory and the fix."""
    choice = choose(root, required, hashes=False)
    for message in choice.warnings:
        warn(message)
    if choice.error is not None:
        raise CheckpointError(choice.error)
    if choice.path is None:
        raise CheckpointError(f"{root}: no checkpoint; train first (lmspec run <build>)")
    return choice.path


def _owned_entries(root: Path) -> list[Path]:
    """What lmspec made in a checkpoint directory, in the order to move it: the pointer first."""
    if not root.is_dir():
        return []
    names = sorted(os.listdir(root))
    ordered = [n for n in (LATEST, LATEST_TEMP) if n in names]
    ordered += [p.name for _, p in step_entries(root)]
    ordered += [n for n in names if n.startswith(TMP_PREFIX)]
    return [root / n for n in ordered]


def dir_run_id(root: Path) -> str | None:
    """The id of the run whose checkpoints are in `root`: that of `latest`'s step, else of the newest readable one."""
    named, _ = read_latest(root)
    for path in ([root / named] if named else []) + [p for _, p in step_dirs(root)]:
        manifest, _ = read_manifest(path) if _not_a_step_dir(path) is None else (None, None)
        if manifest is not None and manifest.run_id is not None:
            return manifest.run_id
    return None


def _aside_dir(root: Path, run_id: str | None) -> Path:
    base = root / PREVIOUS_RUNS / (run_id or UNIDENTIFIED)
    target, n = base, 1
    while os.path.lexists(target):
        n += 1
        target = base.with_name(f"{base.name}-{n}")
    return target


def move_aside(root: Path, entries: list[Path], run_id: str | None) -> Path:
    """Rename `entries` (all directly in `root`) into a fresh previous_runs/<run id>/ directory."""
    target = _aside_dir(root, run_id)
    target.mkdir(parents=True)
    for entry in entries:
        os.rename(entry, target / entry.name)
    _fsync_dir(target)
    _fsync_dir(root)
    return target


def _dist() -> Any:  # the torch.distributed module
    """torch.distributed, imported where ranks are involved: finding a checkpoint needs no torch."""
    import torch.distributed

    return torch.distributed


def _is_rank0() -> bool:
    dist = _dist()
    return not dist.is_initialized() or dist.get_rank() == 0


def _barrier() -> None:
    dist = _dist()
    if dist.is_initialized():
        dist.barrier()


_T = TypeVar("_T")


def _broadcast(value: _T) -> _T:
    """Rank 0's `value` on every rank (the same type: it is rank 0's object, pickled)."""
    dist = _dist()
    if not dist.is_initialized():
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def warn(message: str) -> None:
    logger.warning(f"lmspec: warning: {message}")


class Checkpoints:
    """Save and find one run's checkpoints under one directory; every rank calls every method.

    `required`: files every usable checkpoint's manifest must list (the trainer's own state).
    """

    def __init__(self, root: Path, keep_last_k: int, required: tuple[str, ...] = ()) -> None:
        self.root = root
        self.keep_last_k = keep_last_k
        self.required = required
        self.run_id: str | None = None  # decided by open_run, or by the first save
        self.lineage: frozenset[str | None] = frozenset()  # manifests' run ids that are this run's

    def open_run(self, resume: Resume) -> Path | None:
        """Decide this run's identity before training: the checkpoint to resume from (None = fresh start).

        auto: the newest usable checkpoint, whose run this run continues; none -> a fresh run.
        never: a fresh run; the earlier run's checkpoints are moved aside first (module docstring).
        """
        result: tuple[str | None, str | None, bool, str | None] = (None, None, False, None)
        if _is_rank0():
            result = self._open_on_rank0(resume)
        chosen, run_id, legacy, problem = _broadcast(result)
        _barrier()
        if problem is not None:
            raise CheckpointError(problem)
        self._adopt(run_id, legacy)
        return None if chosen is None else Path(chosen)

    def _open_on_rank0(self, resume: Resume) -> tuple[str | None, str | None, bool, str | None]:
        if os.path.lexists(self.root) and not self.root.is_dir():
            return None, None, False, choose(self.root).error
        try:
            if resume == "never":
                entries = _owned_entries(self.root)
                if entries:
                    old = dir_run_id(self.root)
                    target = move_aside(self.root, entries, old)
                    warn(
                        f"train.checkpoint.resume=never: moved the checkpoints of the previous run "
                        f"({', '.join(e.name for e in entries)}) aside into {target}; nothing was deleted, "
                        "remove it when it is no longer needed"
                    )
                run_id, chosen, legacy = new_run_id(), None, False
            else:
                choice = choose(self.root, self.required)
                for message in choice.warnings:
                    warn(message)
                if choice.error is not None:
                    return None, None, False, choice.error
                chosen = None if choice.path is None else str(choice.path)
                legacy = choice.legacy
                run_id = choice.run_id if choice.run_id is not None else new_run_id()
        except OSError as exc:
            return (
                None,
                None,
                False,
                (
                    f"train.checkpoint.dir={str(self.root)!r}: {exc.strerror}"
                    f"{f' ({exc.filename})' if exc.filename else ''}; make it writable or compile with another "
                    "train.checkpoint.dir"
                ),
            )
        return chosen, run_id, legacy, None

    def _adopt(self, run_id: str | None, legacy: bool) -> None:
        self.run_id = run_id
        self.lineage = frozenset({run_id, None} if legacy else {run_id})

    def _ensure_run(self) -> None:
        """A save without open_run (the HF import's step 0, tests): a fresh run, decided on rank 0."""
        if self.run_id is None:
            self._adopt(_broadcast(new_run_id()), legacy=False)

    def _is_ours(self, step_dir: Path) -> bool:
        if _not_a_step_dir(step_dir) is not None:
            return False
        manifest, _ = read_manifest(step_dir)
        return manifest is not None and manifest.run_id in self.lineage

    def begin_save(self, step: int) -> Path:
        """A fresh temp directory for step `step` (rank 0 creates it; all ranks wait)."""
        self._ensure_run()
        tmp = self.root / f"{TMP_PREFIX}{step}"
        if _is_rank0():
            self.root.mkdir(parents=True, exist_ok=True)
            for stale in self.root.glob(f"{TMP_PREFIX}*"):  # this directory's own unfinished saves
                if stale.is_dir() and not stale.is_symlink():
                    shutil.rmtree(stale, ignore_errors=True)
                else:
                    stale.unlink(missing_ok=True)
            tmp.mkdir()
        _barrier()
        return tmp

    def commit(self, step: int, tmp: Path) -> Path:
        """After every rank wrote into `tmp`: manifest, rename, `latest`, prune this run's old steps."""
        _barrier()
        final = self.root / step_dir(step)
        if _is_rank0():
            _fsync_tree(tmp)
            files = {rel: sha256_file(tmp / rel) for rel in _files(tmp)}
            manifest = {"step": step, "run_id": self.run_id, "files": files}
            manifest_path = tmp / STEP_MANIFEST
            with open(manifest_path, "w", encoding="utf-8") as fh:
                json.dump(manifest, fh, indent=2, sort_keys=True)
                fh.flush()
                os.fsync(fh.fileno())
            _fsync_dir(tmp)
            self._clear(final)
            os.rename(tmp, final)
            _fsync_dir(self.root)
            self._clear(self.root / LATEST, only_dirs=True)
            latest, temp = self.root / LATEST, self.root / LATEST_TEMP
            temp.unlink(missing_ok=True)  # a save killed between writing it and the rename
            replace_file(latest, f"{final.name}\n".encode(), temp)
            mine = [path for _, path in step_dirs(self.root) if self._is_ours(path)]
            for old in mine[self.keep_last_k :]:
                shutil.rmtree(old, ignore_errors=True)
        _barrier()
        return final

    def _clear(self, path: Path, only_dirs: bool = False) -> None:
        """Make room at `path`: this run's own step directory is replaced; anything else is moved aside."""
        if not os.path.lexists(path):
            return
        if only_dirs and not (path.is_dir() and not path.is_symlink()):
            return  # a file or symlink `latest` is replaced by the rename itself
        if not only_dirs and self._is_ours(path):
            shutil.rmtree(path)
            return
        manifest, _ = read_manifest(path) if _not_a_step_dir(path) is None else (None, None)
        target = move_aside(self.root, [path], manifest.run_id if manifest is not None else None)
        warn(f"{path} is not this run's; moved it aside into {target} instead of overwriting it")

    def find_resumable(self) -> Path | None:
        """The newest verified checkpoint (rank 0 decides, every rank gets the same answer); no identity change."""
        chosen: str | None = None
        problem: str | None = None
        if _is_rank0():
            choice = choose(self.root, self.required)
            for message in choice.warnings:
                warn(message)
            chosen = None if choice.path is None else str(choice.path)
            problem = choice.error
        chosen, problem = _broadcast((chosen, problem))
        if problem is not None:
            raise CheckpointError(problem)
        return None if chosen is None else Path(chosen)
