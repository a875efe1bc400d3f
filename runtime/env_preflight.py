"""The environment variables launch/torchrun.sh and torchrun read, checked before any process starts.

`lmspec run` hands its own environment to launch/torchrun.sh, which hands it to torchrun and every rank. A
wrong value there fails late and badly: `MASTER_PORT=abc` and `TORCH_DISTRIBUTED_DEBUG=garbage` in a
traceback of torchrun's; a stray `NODE_RANK=1` on a one-node job, or a `MASTER_ADDR` that does not resolve,
in a rendezvous that retries until it is killed; `LMSPEC_PYTHON` naming no interpreter in bash's bare
"No such file or directory" (exit 127), which never names the variable. So each is read here as torchrun.sh
and torch read it, and the first wrong one is a UsageError (exit 2) naming the variable, its value and the
fix, in bounded time: the address lookup waits RESOLVE_SECONDS at most.

The run directory and train.checkpoint.dir are then written to (PROBE_BYTES, removed at once): a read-only
or full one is refused here, before step 1, not at the first save, steps later. One that fills during
training is reported by the rank that meets it (runtime/train/rank_exit.py).
"""

from __future__ import annotations

import errno
import os
import shutil
import socket
import sys
import threading
from pathlib import Path

from lmspec.compiler.build.atomic import missing_directories, remove_empty
from lmspec.compiler.build.files import run_dir
from lmspec.compiler.errors import UsageError
from lmspec.compiler.launch_names import PYTHON_ENV
from lmspec.compiler.spec.sections import TrainingSpec

RESOLVE_SECONDS = 10.0  # a resolver that answers nothing within this is as good as a name that does not resolve
PROBE_TRIES = 5  # makes of the probed directory, against other nodes' probes removing it (`_probe`)
PROBE_BYTES = 64 * 1024  # written and removed: a full file system refuses it (an empty file needs no block)
DEBUG_LEVELS = ("OFF", "INFO", "DETAIL")  # torch's c10d::debug_level(), which compares them case-insensitively


def check_launch(env: dict[str, str], spec: TrainingSpec) -> None:
    """Refuse (UsageError) the first variable of `env` that would stop torchrun.sh, torchrun or a rank of `spec`
    (variables that are unset take torchrun.sh's defaults, which are right), then a run directory or
    train.checkpoint.dir that cannot be written."""
    _check_python(env)
    _check_port(env)
    _check_debug(env)
    _check_node_rank(env, spec.hardware.nodes)
    _check_address(env)
    run = Path(run_dir(spec.name))
    _check_writable(
        run,
        f"the run directory {run} (metrics, each rank's output)",
        "run lmspec from a working directory on another file system (runs/ is written there)",
    )
    checkpoints = Path(spec.train.checkpoint.dir)
    _check_writable(
        checkpoints, f"train.checkpoint.dir={str(checkpoints)!r}", "compile with train.checkpoint.dir on another one"
    )


def _check_python(env: dict[str, str]) -> None:
    """$LMSPEC_PYTHON as torchrun.sh runs it (`${LMSPEC_PYTHON:-python3}`): a path, or a name on PATH."""
    value = env.get(PYTHON_ENV)
    if value is None:
        return
    found = shutil.which(value or "python3", path=env.get("PATH"))
    if found is None or not os.path.isfile(found):
        raise UsageError(
            f"{PYTHON_ENV}={value!r} names no executable file: it is the interpreter every rank runs; set it to a "
            f"python that imports torch and lmspec, or unset it to use lmspec's own ({sys.executable})"
        )


def _check_port(env: dict[str, str]) -> None:
    value = env.get("MASTER_PORT")
    if not value:  # unset or empty: torchrun.sh's default (cluster.master_port, or a free port on one node)
        return
    if not (value.isascii() and value.isdigit() and int(value) <= 65535):
        raise UsageError(
            f"MASTER_PORT={value!r} is not a port number: torchrun's rendezvous listens there; set it to a free port "
            "in 1..65535, the same on every node, or unset it (one node: a free port is chosen)"
        )


def _check_debug(env: dict[str, str]) -> None:
    value = env.get("TORCH_DISTRIBUTED_DEBUG")
    if value is not None and value.upper() not in DEBUG_LEVELS:
        raise UsageError(
            f"TORCH_DISTRIBUTED_DEBUG={value!r} is not a level torch knows: set it to {', '.join(DEBUG_LEVELS)}, "
            "or unset it"
        )


def _check_node_rank(env: dict[str, str], nodes: int) -> None:
    """NODE_RANK as torchrun.sh reads it (`${NODE_RANK:-${SLURM_NODEID:-0}}`): 0..nodes-1."""
    name = "NODE_RANK" if env.get("NODE_RANK") else "SLURM_NODEID"
    value = env.get(name)
    if not value:
        return
    if value.isascii() and value.isdigit() and int(value) < nodes:
        return
    where = "a one-node job (node rank 0)" if nodes == 1 else f"a job on {nodes} nodes (node ranks 0..{nodes - 1})"
    fix = f"unset {name} (left from another job?)" if nodes == 1 else f"set {name} to this node's rank, 0..{nodes - 1}"
    raise UsageError(f"{name}={value!r} is no node of {where}: torchrun would wait for the others forever; {fix}")


def _check_address(env: dict[str, str]) -> None:
    """MASTER_ADDR resolves, asked in a thread so that a resolver that never answers costs RESOLVE_SECONDS."""
    host = env.get("MASTER_ADDR")
    if not host:  # unset: torchrun.sh's loopback on one node; on several it stops with its own message
        return
    errors: list[str] = []
    answered = threading.Event()

    def lookup() -> None:
        try:
            socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError) as exc:
            errors.append(getattr(exc, "strerror", None) or str(exc))
        answered.set()

    threading.Thread(target=lookup, name="MASTER_ADDR lookup", daemon=True).start()
    if not answered.wait(RESOLVE_SECONDS):
        reason = f"no answer from the resolver in {RESOLVE_SECONDS:.0f} s"
    elif errors:
        reason = errors[0]
    else:
        return
    raise UsageError(
        f"MASTER_ADDR={host!r} does not resolve ({reason}): the rendezvous would retry until killed; set it to "
        "node 0's address as this node reaches it (a host name or an IP), or unset it on one node"
    )


def _check_writable(directory: Path, what: str, elsewhere: str) -> None:
    """Write PROBE_BYTES into `directory` (created for the probe, then removed again with the parents it needed),
    so that a full or read-only directory is refused before step 1 rather than at the first save."""
    missing = missing_directories(directory)
    try:
        _probe(directory)
    except OSError as exc:
        raise UsageError(f"{what} cannot be written: {_disk_fix(exc, directory, elsewhere)}") from None
    finally:
        remove_empty(missing)


def _probe(directory: Path) -> None:
    """Write and remove this process's probe file in `directory`. The nodes of a job started by hand probe one
    shared directory at once: when another's probe removed a directory this one had just made (FileNotFoundError),
    it is made again, PROBE_TRIES times at most."""
    probe = directory / f".lmspec-probe-{socket.gethostname()}-{os.getpid()}"
    for attempt in range(PROBE_TRIES):
        try:
            directory.mkdir(parents=True, exist_ok=True)
            fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            break
        except FileNotFoundError:
            if attempt == PROBE_TRIES - 1:
                raise
    try:
        view = memoryview(bytes(PROBE_BYTES))
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)
        os.unlink(probe)


def _disk_fix(exc: OSError, directory: Path, elsewhere: str) -> str:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        left = free_bytes(directory) / 2**20
        return f"{exc.strerror} ({left:,.1f} MiB left there); free space on its file system, or {elsewhere}"
    if exc.errno == errno.EROFS:
        return f"it is on a read-only file system; remount it writable, or {elsewhere}"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return f"{exc.strerror} at {exc.filename}; give this user write access there, or {elsewhere}"
    return f"{exc.strerror or exc} at {exc.filename}; fix that path, or {elsewhere}"


def free_bytes(directory: Path) -> int:
    """Bytes an unprivileged writer has left on `directory`'s file system (of its nearest existing parent)."""
    for candidate in (directory, *directory.parents):
        try:
            info = os.statvfs(candidate)
        except OSError:
            continue
        return info.f_bavail * info.f_frsize
    return 0
