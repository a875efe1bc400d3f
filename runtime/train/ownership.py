"""A run owns its directories: one identity per checkpoint directory, one `lmspec run` at a time.

Identity. Two builds that share a train.checkpoint.dir (or a run directory) are one run only when they train
the same model from the same data the same way: `run_identity` is the model's shapes (the keys whose change
makes other tensors, lmspec.compiler.resume_layout.MODEL_KEYS), the optimizer, the training data and
tokenizer, and the seed. The learning rate, the number of steps and the layout are not part of it: a resume
may legitimately change them (a layout change is judged by resume_layout from the manifest's `saved_with`).
Every manifest records it (lmspec.runtime.train.checkpoint); `lmspec run` compares it with the checkpoint
resume would load before anything starts (`refuse_another_run`), as the trainer does again before loading
(Checkpoints.open_run, for a launch that bypasses `lmspec run`). Without that, a second build silently
resumed the first one's step, took over its run id, and keep_last_k deleted its checkpoints.

Exclusion. `lmspec run` holds an exclusive flock on `.lmspec-run.lock` in the run directory and in the
checkpoint directory for as long as it trains (`RunLock`): a second `lmspec run` of the same build, or of
another that shares either directory, stops at once (exit 2) naming the holder, before it starts a rank or
touches a file of the first. The kernel drops the lock when its holder dies, however it dies: a stale lock
file never blocks. The file stays (removing a lock file lets a third process lock a different inode). A job on
several nodes started by hand runs one `lmspec run` per node from one shared working directory: each node locks
its own file (`lock_file`), so the nodes of one run share the directories and two runs' same nodes exclude
each other.
"""

from __future__ import annotations

import datetime
import fcntl
import json
import logging
import os
import signal
import socket
from pathlib import Path
from types import TracebackType
from typing import Any

from lmspec.compiler.build.files import STEP_PREFIX
from lmspec.compiler.errors import UsageError
from lmspec.compiler.resume_layout import MODEL_KEYS
from lmspec.compiler.spec.sections import TrainingSpec
from lmspec.compiler.spec.shown_key import plain, value_at
from lmspec.runtime.train.checkpoint import another_run, dir_manifests, read_latest

logger = logging.getLogger(__name__)

LOCK_FILE = ".lmspec-run.lock"  # node 0's (a one-node job's)


def lock_file(node: int) -> str:
    """The lock file of node `node` of a job (module docstring)."""
    return LOCK_FILE if node == 0 else f".lmspec-run.node{node}.lock"


IDENTITY_KEYS = (
    *(f"model.{key}" for key in MODEL_KEYS),
    "train.optimizer.name",
    "train.data.tokenizer",
    "train.data.tokenizer_path",
    "train.data.sources",
    "train.seed",
)


def run_identity(spec: TrainingSpec) -> dict[str, Any]:
    """{spec key: value} of IDENTITY_KEYS: what a checkpoint directory's run is (module docstring)."""
    return {key: plain(value_at(spec, key)) for key in IDENTITY_KEYS}  # JSON data, as the manifest holds it


def refuse_another_run(spec: TrainingSpec) -> None:
    """UsageError when train.checkpoint.resume=auto would resume the checkpoints of a run of another identity.

    Reads the step `latest` names (else the newest readable one), hashing nothing: the trainer verifies the
    files, and judges the step it actually chooses again."""
    if spec.train.checkpoint.resume != "auto":
        return
    for step, manifest in dir_manifests(Path(spec.train.checkpoint.dir)):
        if (why := another_run(step, manifest.run_id, manifest.identity, run_identity(spec))) is not None:
            raise UsageError(why)
        return


def _holder() -> str:
    since = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": since})


def _held_by(fd: int) -> str:
    """Who holds the lock, from what it wrote into the file (it may be writing it right now)."""
    try:
        doc = json.loads(os.pread(fd, 4096, 0).decode())
        return f"pid {doc['pid']} on {doc['host']}, since {doc['since']}"
    except (OSError, ValueError, TypeError, KeyError):
        return "a process that has not said who it is yet"


class RunLock:
    """The run directory and the checkpoint directory, each locked for one `lmspec run` (module docstring)."""

    def __init__(self, spec: TrainingSpec, run_dir: Path, node: int = 0) -> None:
        self.file = lock_file(node)
        self.places = [
            (run_dir, f"the run directory {run_dir}/ of name={spec.name}"),
            (Path(spec.train.checkpoint.dir), f"train.checkpoint.dir={spec.train.checkpoint.dir}"),
        ]
        self.fds: list[int] = []

    def __enter__(self) -> RunLock:
        try:
            for directory, what in self.places:
                self._lock(directory, what)
        except BaseException:
            self.release()
            raise
        return self

    def _lock(self, directory: Path, what: str) -> None:
        path = directory / self.file
        try:
            directory.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise UsageError(
                f"{what}: cannot create {path}: {exc.strerror}; make it writable or compile with another "
                "train.checkpoint.dir"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _held_by(fd)
            os.close(fd)
            raise UsageError(
                f"{what} is in use by another lmspec run ({holder}; lock {path}): two runs would mix their "
                "checkpoints and metrics; wait for it to end or stop it, or compile this build with another name "
                "and train.checkpoint.dir"
            ) from None
        except OSError as exc:  # a file system without locks (an NFS mount without lockd): run unguarded
            os.close(fd)
            logger.warning(f"lmspec run: warning: {path} cannot be locked ({exc.strerror}); nothing stops a second run")
            return
        self.fds.append(fd)
        os.ftruncate(fd, 0)
        os.pwrite(fd, _holder().encode(), 0)

    def release(self) -> None:
        for fd in self.fds:
            os.close(fd)  # closing the last descriptor drops the flock
        self.fds.clear()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.release()


def stopped_line(spec: TrainingSpec, build: Path, code: int) -> str:
    """What a stopped `lmspec run` says last: the checkpoint it can resume from, and how."""
    root = Path(spec.train.checkpoint.dir)
    name, _ = read_latest(root)
    stopped, how = f"lmspec run: stopped by {signal.Signals(code - 128).name}", f"`lmspec run {build}`"
    if name is None:
        return f"{stopped}; no checkpoint was saved: {how} starts again from step 0"
    return f"{stopped}; checkpointed at step {name.removeprefix(STEP_PREFIX)} ({root / name}): {how} resumes from it"
