"""Crash-safe checkpoints owned by the run that wrote them: temp dir, fsync, digest manifest, rename, `latest`.

Layout under `train.checkpoint.dir` (relative to the working directory):

    latest                     one line: the newest COMPLETE step directory, e.g. "step_20"
    step_<N>/                  one complete checkpoint (N = optimizer steps done)
      manifest.json            {"step": N, "run_id": "<32 hex>", "digest": "xxh3_128",
                               "files": {relative path: digest}, "saved_with": {...},
                               "identity": {spec key: value}}
                               - written last; a manifest without "digest" (older lmspec)
                               lists sha256 digests; "saved_with" records the backend,
                               layout and model that wrote the step (lmspec.compiler.
                               resume_layout), so a resume at another layout is judged;
                               "identity" the spec values that make the run this run
                               (lmspec.runtime.train.ownership: model shape, optimizer,
                               data, seed), which no resume may change
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
    .tmp-step_<N>/             a save in progress (never read; removed by the next save, also one
                               a killed run left)
    .lmspec-run.lock           held (flock) by the `lmspec run` that trains into the directory
                               (lmspec.runtime.train.ownership); never removed
    previous_runs/<run id>/    checkpoints of earlier runs, moved aside (see below); never read

A save writes everything into `.tmp-step_<N>`, fsyncs every file, writes the
manifest, renames the directory to `step_<N>` and only then rewrites `latest`
(write `latest.tmp`, fsync, rename). A process killed at any point leaves either
the previous `latest` or the new one, never a pointer to a partial directory.

Integrity without a rank-0 pass (issue 40). Each rank digests the files it writes as it writes them
(lmspec.runtime.train.megatron.digested_save for megatron-core's shards, the bytes in hand for the
trainer state) and `commit` gathers those digests; a file no rank digested while writing it (what a
library writes out of lmspec's reach: megatron-core's metadata, DeepSpeed's files) is read back once,
by one rank, the files dealt round the ranks. Only then does rank 0 write the manifest, rename and
move `latest`: every rank's files are durable (each writer fsyncs its own) before `latest` moves. On
resume every rank verifies its share of the files of the candidate step, and the ranks agree on the
first step whose files all match; nothing is read twice by one rank while the others wait.

Run identity. Every run has a run id: a fresh uuid4 when it starts from scratch, the id in the
manifest of the checkpoint it resumes from otherwise (so a run keeps its id across any number of
resumes). It is written into every step's manifest (the directory's run is the one of `latest`'s
step: `dir_run_id`; no separate file, so the directory holds only what it always did). `keep_last_k` prunes
only the current run's checkpoints (a manifest without a run id, written before run ids
existed, counts as the current run's only when the run resumed from one); a step directory of
another run that stands where a save of this run goes is moved aside, not deleted.

A run owns its directory. Every manifest records the run's identity (the spec values that make it the
same run: model shape, optimizer, data, seed; not the learning rate, the steps or the layout, which a
resume may change); `resume: auto` refuses a step whose identity differs (AnotherRun, before anything is
loaded or written), naming the directory and each key with both values: continuing it would mix two runs
in one directory, take over its run id and let keep_last_k delete its steps. A manifest without an
identity (an older lmspec) gives no verdict.

`train.checkpoint.resume: never` starts a fresh run: before anything is written, every entry
lmspec made in the checkpoint directory (`latest`, `step_<N>`, `.tmp-step_<N>`) is
MOVED into `previous_runs/<old run id>/` (`previous_runs/unidentified/` when no id can be read;
`-2`, `-3`... when that name is taken), with a warning naming it. Nothing is deleted: removing
it is the user's call. Other files in the directory are left where they are. Moving (a rename
inside the same directory) is chosen over refusing because `resume=never` is what lmspec itself
recommends when checkpoints are unusable; it costs no copy.

Resume (`train.checkpoint.resume: auto`): candidates are the step named by `latest`, then every
other `step_<N>` newest first; the first whose manifest is well-formed (an object with the
directory's step, a files map of safe relative paths to digests, and the files the trainer
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
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Literal, TypeVar

from lmspec.compiler.build.atomic import replace_file
from lmspec.compiler.build.files import (
    LATEST,
    LATEST_TEMP,
    PREVIOUS_RUNS,
    STEP_MANIFEST,
    STEP_PREFIX,
    step_dir,
    step_number,
)
from lmspec.runtime.train import digest

logger = logging.getLogger(__name__)

UNIDENTIFIED = "unidentified"
TMP_PREFIX = f".tmp-{STEP_PREFIX}"
PRUNED_SUFFIX = "-pruned"  # .tmp-step_<N>-pruned: a step beyond keep_last_k being removed
_RUN_ID = re.compile(r"[0-9a-f]{32}")
_HEX = re.compile(r"[0-9a-f]+")
_LATEST_MAX_BYTES = 256  # "step_<N>\n" with N of any size a run can reach
_MANIFEST_MAX_BYTES = 64 << 20  # a million listed files; lmspec writes a few per rank
_SHOWN = 60  # characters of a damaged value quoted in a warning

Resume = Literal["auto", "never"]


class CheckpointError(RuntimeError):
    """Checkpoints exist but none can be used: the run must not start from scratch."""


class AnotherRun(CheckpointError):
    """The checkpoint resume would load belongs to a run of another identity: a usage error (exit 2)."""


def new_run_id() -> str:
    return uuid.uuid4().hex


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dirs(root: Path) -> None:
    """Every directory under `root` (their entries: the files' names), bottom-up."""
    for dirpath, _, _ in os.walk(root, topdown=False):
        _fsync_dir(Path(dirpath))


def _fsynced_digest(path: Path) -> str:
    """A file no rank digested while writing it: made durable, then read back once."""
    with open(path, "rb") as fh:
        os.fsync(fh.fileno())
    return digest.file_digest(path)


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
    algorithm: str = digest.WRITTEN  # digest.LEGACY for a manifest written before the "digest" key
    saved_with: dict[str, Any] | None = None  # None: written before lmspec recorded it
    identity: dict[str, Any] | None = None  # None: written before lmspec recorded it


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
    algorithm, saved_with, identity = doc.get("digest", digest.LEGACY), doc.get("saved_with"), doc.get("identity")
    if algorithm not in digest.HASHERS:
        return None, f"{path}: 'digest' is {_cut_repr(algorithm)}, not one of {', '.join(digest.HASHERS)}"
    if saved_with is not None and not isinstance(saved_with, dict):
        return None, f"{path}: 'saved_with' is {_cut_repr(saved_with)}, not an object"
    if identity is not None and not isinstance(identity, dict):
        return None, f"{path}: 'identity' is {_cut_repr(identity)}, not an object"
    if type(step) is not int:
        return None, f"{path}: 'step' is {_cut_repr(step)}, not an integer"
    if step != step_number(step_dir.name):
        return None, f"{path}: 'step' is {step} but the directory is {step_dir.name}"
    if run_id is not None and not (isinstance(run_id, str) and _RUN_ID.fullmatch(run_id)):
        return None, f"{path}: 'run_id' is {_cut_repr(run_id)}, not a run id"
    if not isinstance(files, dict) or not files:
        return None, f"{path}: 'files' is {_cut_repr(files)}, not a map of the step's files"
    for rel, value in files.items():
        if not (isinstance(value, str) and len(value) == digest.HEX_LENGTH[algorithm] and _HEX.fullmatch(value)):
            return None, f"{path}: the {algorithm} of {_cut_repr(rel)} is {_cut_repr(value)}"
        if (why := _unsafe_path(rel)) is not None:
            return None, f"{path} lists {_cut_repr(rel)}, which {why}"
    return Manifest(step, run_id, dict(files), algorithm, saved_with, identity), None


def verify(step_dir: Path, required: tuple[str, ...] = (), hashes: bool = True) -> str | None:
    """None when the manifest is well-formed, lists `required`, and every file it lists is there (and, with
    `hashes`, matches its digest). One process checks every file: Checkpoints' ranks share the digests."""
    manifest, why = _structure(step_dir, required)
    if manifest is None:
        return why
    return mismatch(step_dir, manifest, sorted(manifest.files)) if hashes else None


def _structure(step_dir: Path, required: tuple[str, ...]) -> tuple[Manifest | None, str | None]:
    """The step's manifest when it is well-formed, lists `required`, and every file it lists is a regular
    file inside the step directory; else why not."""
    if (why := _not_a_step_dir(step_dir)) is not None:
        return None, why
    manifest, why = read_manifest(step_dir)
    if manifest is None:
        return None, why
    absent = [rel for rel in required if rel not in manifest.files]
    if absent:
        return None, f"{step_dir / STEP_MANIFEST} does not list {', '.join(absent)}"
    inside = os.path.realpath(step_dir)
    for rel in manifest.files:
        path = step_dir / rel
        if not os.path.realpath(path).startswith(inside + os.sep):
            return None, f"{path} leads outside {step_dir} (a symlink)"
        try:
            info = path.stat()
        except FileNotFoundError:
            return None, f"{path} is missing"
        except OSError as exc:
            return None, f"{path} cannot be read: {exc.strerror}"
        if not stat.S_ISREG(info.st_mode):
            return None, f"{path} is not a regular file"
    return manifest, None


def mismatch(step_dir: Path, manifest: Manifest, rels: list[str]) -> str | None:
    """Why one of `rels` (files the manifest lists) does not match its digest, or None."""
    for rel in rels:
        path = step_dir / rel
        try:
            found = digest.file_digest(path, manifest.algorithm)
        except OSError as exc:
            return f"{path} cannot be read: {exc.strerror}"
        if found != manifest.files[rel]:
            return f"{path} does not match its {manifest.algorithm} in {STEP_MANIFEST}"
    return None


@dataclass
class Choice:
    """What resume would load: `path` (None = start fresh), the run it belongs to, the warnings on the way,
    and `error` when checkpoints exist but none is usable."""

    path: Path | None = None
    run_id: str | None = None
    legacy: bool = False  # the chosen manifest has no run id
    saved_with: dict[str, Any] | None = None  # what wrote the chosen step (its manifest's record)
    identity: dict[str, Any] | None = None  # the identity of the chosen step's run
    warnings: list[str] = field(default_factory=list)
    error: str | None = None


DigestCheck = Callable[[Path, Manifest], "str | None"]


def _walk(root: Path, required: tuple[str, ...]) -> tuple[Choice, list[tuple[Path, str | None]], bool]:
    """The cheap half of choosing, done once: (a Choice holding the warnings so far or the directory's
    error, the candidates in order - `latest`'s step, then every other newest first - each with why its
    structure is unusable or None, whether any checkpoint exists)."""
    choice = Choice()
    if not os.path.lexists(root):
        return choice, [], False
    if not root.is_dir():
        choice.error = (
            f"train.checkpoint.dir={str(root)!r} is not a directory; move it away or compile with another "
            "train.checkpoint.dir"
        )
        return choice, [], False
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
    walked = [(path, _structure(path, required)[1]) for path in ordered]
    return choice, walked, bool(entries) or named is not None or why is not None


def _decide(
    root: Path, choice: Choice, walked: list[tuple[Path, str | None]], exists: bool, check: DigestCheck
) -> Choice:
    """The first candidate whose structure is sound and whose files `check` finds intact."""
    for i, (path, reason) in enumerate(walked):
        if reason is None:
            manifest, reason = read_manifest(path)
            if manifest is not None and (reason := check(path, manifest)) is None:
                choice.path, choice.run_id, choice.legacy = path, manifest.run_id, manifest.run_id is None
                choice.saved_with, choice.identity = manifest.saved_with, manifest.identity
                return choice
        following = f"trying {walked[i + 1][0].name}" if i + 1 < len(walked) else "no other checkpoint is left"
        choice.warnings.append(f"checkpoint {path.name} is not usable ({reason}); {following}")
    if exists:
        choice.error = (
            f"checkpoints exist under {root} but none verifies; refusing to start from scratch: fix or remove "
            f"them, or set train.checkpoint.resume=never to start a fresh run (lmspec moves them aside into "
            f"{root / PREVIOUS_RUNS}/, deleting nothing)"
        )
    return choice


def _every_file(path: Path, manifest: Manifest) -> str | None:
    return mismatch(path, manifest, sorted(manifest.files))


def choose(root: Path, required: tuple[str, ...] = (), hashes: bool = True) -> Choice:
    """The resume candidate: `latest`'s step, then every other step newest first; the first that verifies.
    One process digests every file (with `hashes`); Checkpoints shares that work among the ranks."""
    choice, walked, exists = _walk(root, required)
    if choice.error is not None:
        return choice
    return _decide(root, choice, walked, exists, _every_file if hashes else lambda path, manifest: None)


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


def dir_manifests(root: Path) -> Iterator[tuple[Path, Manifest]]:
    """The readable manifests of `root`'s steps, `latest`'s first, then newest first (nothing is hashed)."""
    named, _ = read_latest(root)
    for path in ([root / named] if named else []) + [p for _, p in step_dirs(root)]:
        manifest, _ = read_manifest(path) if _not_a_step_dir(path) is None else (None, None)
        if manifest is not None:
            yield path, manifest


def dir_run_id(root: Path) -> str | None:
    """The id of the run whose checkpoints are in `root`: that of `latest`'s step, else of the newest readable one."""
    return next((manifest.run_id for _, manifest in dir_manifests(root) if manifest.run_id is not None), None)


def _shown(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def another_run(
    step: Path, run_id: str | None, saved: Mapping[str, Any] | None, identity: Mapping[str, Any]
) -> str | None:
    """Why a run of `identity` may not resume `step`, of run `run_id` whose identity is `saved`, or None.

    Only the keys both records hold are compared: a manifest without an identity gives no verdict."""
    saved = saved or {}
    differ = [
        f"{key} is {_shown(identity[key])} here but {_shown(saved[key])} there"
        for key in sorted(identity)
        if key in saved and saved[key] != identity[key]
    ]
    if not differ:
        return None
    root = step.parent
    return (
        f"train.checkpoint.dir={str(root)!r} holds the checkpoints of another run ({step.name} of run "
        f"{run_id or UNIDENTIFIED}): {'; '.join(differ)}; this build never resumes it: compile with "
        f"another train.checkpoint.dir, or set train.checkpoint.resume=never to start afresh (lmspec moves "
        f"that run aside into {root / PREVIOUS_RUNS}/, deleting nothing)"
    )


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


def _rank_world() -> tuple[int, int]:
    dist = _dist()
    return (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)


def _is_rank0() -> bool:
    return _rank_world()[0] == 0


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


def _gathered(value: _T) -> list[_T]:
    """Every rank's `value`, in rank order, on every rank."""
    dist = _dist()
    if not dist.is_initialized():
        return [value]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


def _my_share(items: list[_T]) -> list[_T]:
    """This rank's cards when `items` are dealt round the ranks."""
    rank, world = _rank_world()
    return items[rank::world]


def _shared_check(path: Path, manifest: Manifest) -> str | None:
    """Every rank digests its share of the step's files; the first mismatch any rank found, or None."""
    found = _gathered(mismatch(path, manifest, _my_share(sorted(manifest.files))))
    return next((reason for reason in found if reason is not None), None)


def _remove_all(paths: list[Path]) -> None:
    for path in paths:
        shutil.rmtree(path, ignore_errors=True)


def warn(message: str) -> None:
    logger.warning(f"lmspec: warning: {message}")


class Checkpoints:
    """Save and find one run's checkpoints under one directory; every rank calls every method.

    `required`: files every usable checkpoint's manifest must list (the trainer's own state).
    `saved_with`: what writes these checkpoints (backend, layout, model: lmspec.compiler.resume_layout),
    recorded in every manifest; `resumed_with` is the record of the step open_run chose.
    `identity`: the run's identity (lmspec.runtime.train.ownership.run_identity), recorded in every manifest
    and compared with that of the step open_run would resume.
    """

    def __init__(
        self,
        root: Path,
        keep_last_k: int,
        required: tuple[str, ...] = (),
        saved_with: Mapping[str, Any] | None = None,
        identity: Mapping[str, Any] | None = None,
    ) -> None:
        self.root = root
        self.keep_last_k = keep_last_k
        self.required = required
        self.saved_with = dict(saved_with) if saved_with is not None else None
        self.identity = dict(identity) if identity is not None else None
        self.run_id: str | None = None  # decided by open_run, or by the first save
        self.lineage: frozenset[str | None] = frozenset()  # manifests' run ids that are this run's
        self.resumed_with: dict[str, Any] | None = None
        self._pruning: threading.Thread | None = None  # rank 0's removal of pruned steps

    def open_run(self, resume: Resume) -> Path | None:
        """Decide this run's identity before training: the checkpoint to resume from (None = fresh start).

        auto: the newest usable checkpoint, whose run this run continues; none -> a fresh run; AnotherRun
        when that checkpoint's run has another identity.
        never: a fresh run; the earlier run's checkpoints are moved aside first (module docstring).
        """
        if resume == "never":
            problem = self._fresh_on_rank0() if _is_rank0() else None
            problem = _broadcast(problem)
            _barrier()
            if problem is not None:
                raise CheckpointError(problem)
            self._adopt(_broadcast(new_run_id()), legacy=False)
            return None
        choice = self._choose_together()
        if choice.error is not None:
            raise CheckpointError(choice.error)
        if choice.path is not None and self.identity is not None:
            if (why := another_run(choice.path, choice.run_id, choice.identity, self.identity)) is not None:
                raise AnotherRun(why)
        run_id = choice.run_id if choice.run_id is not None else _broadcast(new_run_id())
        self._adopt(run_id, choice.legacy)
        self.resumed_with = choice.saved_with
        return choice.path

    def _fresh_on_rank0(self) -> str | None:
        """resume=never: move an earlier run's checkpoints aside; why that failed, or None."""
        if os.path.lexists(self.root) and not self.root.is_dir():
            return choose(self.root).error
        try:
            entries = _owned_entries(self.root)
            if entries:
                target = move_aside(self.root, entries, dir_run_id(self.root))
                warn(
                    f"train.checkpoint.resume=never: moved the checkpoints of the previous run "
                    f"({', '.join(e.name for e in entries)}) aside into {target}; nothing was deleted, "
                    "remove it when it is no longer needed"
                )
        except OSError as exc:
            return self._unwritable(exc)
        return None

    def _unwritable(self, exc: OSError) -> str:
        return (
            f"train.checkpoint.dir={str(self.root)!r}: {exc.strerror}"
            f"{f' ({exc.filename})' if exc.filename else ''}; make it writable or compile with another "
            "train.checkpoint.dir"
        )

    def _choose_together(self) -> Choice:
        """choose() with the digesting shared: rank 0 walks the directory once (cheap: names, manifests,
        stat), every rank digests its share of each candidate's files, and the ranks agree; rank 0 warns."""
        walked: tuple[Choice, list[tuple[Path, str | None]], bool] | None = None
        if _is_rank0():
            try:
                walked = _walk(self.root, self.required)
            except OSError as exc:
                walked = (Choice(error=self._unwritable(exc)), [], False)
        shared = _broadcast(walked)
        assert shared is not None  # rank 0 always walks
        choice, candidates, exists = shared
        if choice.error is None:
            choice = _decide(self.root, choice, candidates, exists, _shared_check)
        if _is_rank0():
            for message in choice.warnings:
                warn(message)
        return choice

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
            self.join_pruning()
            self.root.mkdir(parents=True, exist_ok=True)
            for stale in self.root.glob(f"{TMP_PREFIX}*"):  # this directory's own unfinished saves
                if stale.is_dir() and not stale.is_symlink():
                    shutil.rmtree(stale, ignore_errors=True)
                else:
                    stale.unlink(missing_ok=True)
            tmp.mkdir()
        _barrier()
        return tmp

    def commit(self, step: int, tmp: Path, written: Mapping[str, str] | None = None) -> Path:
        """After every rank wrote into `tmp` (each writer fsyncs what it writes): the manifest, rename,
        `latest`, prune this run's old steps.

        `written`: {path relative to `tmp`: xxh3_128} of the files this rank digested as it wrote them.
        The files no rank digested are read back once each, dealt round the ranks; then rank 0 alone
        writes the manifest and moves `latest`."""
        known: dict[str, str] = {}
        for share in _gathered(dict(written or {})):
            known.update(share)
        listing = _broadcast(_files(tmp) if _is_rank0() else [])
        unread = _my_share([rel for rel in listing if rel not in known])
        for share in _gathered({rel: _fsynced_digest(tmp / rel) for rel in unread}):
            known.update(share)
        claimed = sorted(set(known) - set(listing))  # every rank holds the same two lists: all raise, or none
        if claimed:
            raise CheckpointError(f"{tmp}: digested as written but not there: {', '.join(claimed[:5])}")
        final = self.root / step_dir(step)
        if _is_rank0():
            _fsync_dirs(tmp)
            manifest = {
                "step": step,
                "run_id": self.run_id,
                "digest": digest.WRITTEN,
                "files": {rel: known[rel] for rel in listing},
                "saved_with": self.saved_with,
                "identity": self.identity,
            }
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
            self._prune(mine[self.keep_last_k :])
        _barrier()
        return final

    def _prune(self, old: list[Path]) -> None:
        """Delete this run's steps beyond keep_last_k off the training path: each is renamed out of the step
        names at once (a resume never sees half of one), then removed by a thread while training goes on
        (deleting terabytes from rank 0 inside the commit held every rank: bench/checkpoint_scale.py)."""
        self.join_pruning()
        doomed = []
        for path in old:
            target = path.with_name(f".tmp-{path.name}{PRUNED_SUFFIX}")  # under TMP_PREFIX: swept like a stale save
            os.rename(path, target)
            doomed.append(target)
        if doomed:
            self._pruning = threading.Thread(target=_remove_all, args=(doomed,), name="lmspec-prune")
            self._pruning.start()

    def join_pruning(self) -> None:
        """Wait until the pruned steps are gone (before the next save, and at the end of a run)."""
        if self._pruning is not None:
            self._pruning.join()
            self._pruning = None

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
        """The newest verified checkpoint (the ranks share the digesting and agree); no identity change."""
        choice = self._choose_together()
        if choice.error is not None:
            raise CheckpointError(choice.error)
        return choice.path
