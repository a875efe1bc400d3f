"""How a rank ends: a full or read-only disk in one line, and a record of the end for `lmspec run`'s summary.

Every rank runs `run_rank(main, argv)` (runtime/train/__main__.py). Two things happen there:

- A disk that refuses a write (ENOSPC, EDQUOT, EROFS), wherever in the trainer it surfaces (a checkpoint's
  file, metrics.jsonl; raised bare, wrapped by torch's distributed checkpoint, or without its errno while one
  of the run's directories is full), ends the rank with one line,
  "no space left on DIR" and the fix, exit 2, instead of a traceback. DIR is train.checkpoint.dir or the run
  directory when the failed path lies in one, else the path's own directory; a write that named no path is
  blamed on whichever of the two has the least space left.
- Whatever the end, short of a signal that kills outright, the rank leaves EXIT_RECORD beside the error file
  torchrun gave it ($TORCHELASTIC_ERROR_FILE: runs/<name>/rank_logs/<launch>/.../attempt_N/<local rank>/):
  its exit code, its first error line, the time. A rank with no record was killed (SIGKILL, the OOM killer) or
  died in native code: that is how runtime/rank_failures.py tells the rank that died first from the ranks
  that then failed for want of it (a gloo "Connection reset by peer").
"""

from __future__ import annotations

import errno
import json
import logging
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from torch.distributed.elastic.multiprocessing.errors import record

from lmspec.compiler.build.files import run_dir
from lmspec.compiler.errors import EXIT_FAILED, EXIT_USAGE
from lmspec.runtime.env_preflight import free_bytes

logger = logging.getLogger(__name__)

EXIT_RECORD = "lmspec-exit.json"
ERROR_FILE_ENV = "TORCHELASTIC_ERROR_FILE"  # torchrun sets it for each worker
DISK_ERRNOS = {
    errno.ENOSPC: "no space left on",
    errno.EDQUOT: "disk quota exceeded on",
    errno.EROFS: "read-only file system:",
}
FULL_BYTES = 2**20  # less left than this on a run's directory: a failure there is the full disk's
MAX_LINE = 300  # characters of a rank's error kept in its record


def run_rank(main: Callable[[list[str]], int], argv: list[str]) -> int:
    """`main(argv)` under torchrun's `record` (a rank's uncaught error reaches torchrun's failure summary), with
    a refused disk write reported as one line (exit 2) and the end written to EXIT_RECORD."""
    code, error = EXIT_FAILED, ""

    def disk_errors_named(args: list[str]) -> int:
        nonlocal error
        try:
            return main(args)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # torch's CheckpointException is a BaseException
            line = _disk_line(exc, Path(args[0]) if args else None)
            if line is None:
                raise
            error = line
            logger.error(f"lmspec: error: {error}")
            return EXIT_USAGE

    try:
        code = record(disk_errors_named)(argv) or 0
    except BaseException as exc:
        error = _first_line(exc)
        raise
    finally:
        _write_record(code, error)
    return code


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """`exc`, what caused it, and the per-rank failures torch's CheckpointException carries, each once."""
    seen: set[int] = set()
    todo = [exc]
    while todo:
        current = todo.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        todo.extend(e for e in (current.__cause__, current.__context__) if e is not None)
        failures = getattr(current, "failures", None)
        if isinstance(failures, dict):  # torch.distributed.checkpoint: rank -> exception or (exception, traceback)
            for failure in failures.values():
                inner = failure[0] if isinstance(failure, tuple) else failure
                if isinstance(inner, BaseException):
                    todo.append(inner)


def _disk_line(exc: BaseException, build_dir: Path | None) -> str | None:
    """The one line for a write the disk refused somewhere in `exc`'s chain; None for any other failure.

    Some writers lose the errno (torch.save's C++ writer says "file write failed" or "unexpected pos"; megatron's
    checkpoint workers re-raise that as a RuntimeError): a failure of any kind while one of the run's directories
    has less than FULL_BYTES left is that directory's full disk."""
    refused = next((e for e in _chain(exc) if isinstance(e, OSError) and e.errno in DISK_ERRNOS), None)
    places = _places(build_dir)
    if refused is None:
        if not any(free_bytes(p) < FULL_BYTES for p in places):
            return None
        refused = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    what = DISK_ERRNOS[refused.errno or errno.ENOSPC]
    path = Path(os.fsdecode(refused.filename)) if refused.filename else None
    if path is not None:
        directory = next((p for p in places if _inside(path, p)), path.parent)
    else:
        directory = min(places, key=free_bytes) if places else Path(".")
    if refused.errno == errno.EROFS:
        fix = "remount it writable, or compile with train.checkpoint.dir on a writable file system, and run again"
    else:
        fix = (
            f"free space there ({free_bytes(directory) / 2**20:,.1f} MiB left), or compile with "
            "train.checkpoint.dir on a larger file system, and run again (the last complete checkpoint resumes)"
        )
    return f"{what} {directory}: {fix}"


def _places(build_dir: Path | None) -> list[Path]:
    """train.checkpoint.dir and the run directory of the build this rank trains, as the spec names them."""
    if build_dir is None:
        return []
    try:
        from lmspec.compiler.build.reader import Build

        spec = Build.open(build_dir).training()
    except Exception:  # the build was readable at the start; if it is not now, name the path alone
        return []
    return [Path(spec.train.checkpoint.dir), Path(run_dir(spec.name))]


def _inside(path: Path, directory: Path) -> bool:
    return Path(os.path.abspath(path)).is_relative_to(os.path.abspath(directory))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:MAX_LINE]


def _write_record(code: int, error: str) -> None:
    """EXIT_RECORD beside torchrun's error file for this rank; nothing when not under torchrun or when the disk
    refuses this too (the summary then reads the rank as one that ended without a word)."""
    error_file = os.environ.get(ERROR_FILE_ENV)
    if not error_file:
        return
    doc = {"exit": code, "error": error[:MAX_LINE], "time": time.time(), "rank": os.environ.get("RANK")}
    try:
        Path(error_file).with_name(EXIT_RECORD).write_text(json.dumps(doc) + "\n", encoding="utf-8")
    except OSError:
        pass
