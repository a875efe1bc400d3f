"""The one line `lmspec run` ends a failed local training with: which rank failed first, and how.

When one rank dies, the others fail for want of it (gloo's "Connection reset by peer"), torchrun stops them and
prints its ChildFailedError report, which lists every rank's traceback. That report is kept (it is torchrun's
and holds every rank's traceback); this line follows it, so the last line on the console names the cause.

It is read from the files of the launch: launch/torchrun.sh gives torchrun a log folder per launch,
runs/<name>/rank_logs/local-<time>-<pid>/ (<pid>: the shell's, which execs torchrun, so the process `lmspec run`
started), and torchrun keeps each local rank's output and error file in <rdzv id>_<x>/attempt_<n>/<local rank>/.
Every rank that ends in Python leaves runtime/train/rank_exit.py's EXIT_RECORD there (exit code, first error
line, time); a rank without one was killed outright (SIGKILL, the OOM killer) or died in native code, and
nothing the others did can have caused that, so it is named first; otherwise the earliest failure recorded.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path

from lmspec.compiler.build.files import RANK_LOGS, run_dir
from lmspec.compiler.errors import EXIT_OK, EXIT_USAGE
from lmspec.runtime.train.rank_exit import EXIT_RECORD

logger = logging.getLogger(__name__)

SOURCE_LOCATION = re.compile(r"\[[^\]\s]*\.(?:cc|cpp|h):\d+\] ")  # gloo's "[/__w/.../pair.cc:553] ": noise here
THEN_CHARS = 160  # of the error a later rank failed with, after the first one's


@dataclass(frozen=True)
class RankEnd:
    rank: int  # local rank on this node
    exit: int | None  # None: no record, killed outright
    error: str
    time: float  # when it ended (record), or its output's last write (no record)


def report_failed_ranks(code: int, pid: int, name: str) -> int:
    """After torchrun (process `pid`, training job `name`) exited with `code`: log the summary line when it
    failed; return `code`, or 2 when the rank that failed first did for a usage or disk error (its own 2)."""
    if code == EXIT_OK:
        return code
    ends = rank_ends(launch) if (launch := launch_dir(name, pid)) is not None else []
    logger.error(f"lmspec run: {summary(code, launch, ends)}")
    first = first_failures(ends)
    return EXIT_USAGE if first and first[0].exit == EXIT_USAGE else code  # a full disk, say: exit 2 as elsewhere


def launch_dir(name: str, pid: int) -> Path | None:
    found = sorted((Path(run_dir(name)) / RANK_LOGS).glob(f"local-*-{pid}"))
    return found[-1] if found else None


def first_failures(ends: list[RankEnd]) -> list[RankEnd]:
    """The ranks that did not end well, the one to blame first: killed outright before any that reported."""
    return sorted((end for end in ends if end.exit != EXIT_OK), key=lambda end: (end.exit is not None, end.time))


def summary(code: int, launch: Path | None, ends: list[RankEnd]) -> str:
    where = f"; each rank's output is under {launch}/" if launch is not None else ""
    failed = first_failures(ends)
    if not failed:
        return f"training failed (exit code {code}) before any rank reported an end; torchrun's message is above{where}"
    first, *others = failed
    if first.exit is None:
        line = (
            f"rank {first.rank} died first, without an error of its own: killed by a signal (SIGKILL, or the OOM "
            "killer: see `dmesg`) or crashed in native code"
        )
    else:
        line = f"rank {first.rank} failed first (exit code {first.exit}): {first.error or 'see its output'}"
    then = [end for end in others if end.error]
    if then:
        line += f"; then rank {then[0].rank}: {SOURCE_LOCATION.sub('', then[0].error)[:THEN_CHARS]}"
    return f"training failed: {line}{where}"


def rank_ends(launch: Path) -> list[RankEnd]:
    """Each local rank of the launch's last attempt, and how it ended."""
    attempts = sorted(launch.glob("*/attempt_*"), key=lambda path: int(path.name.rpartition("_")[2]))
    if not attempts:
        return []
    return [
        _rank_end(directory)
        for directory in sorted(attempts[-1].iterdir(), key=lambda path: path.name)
        if directory.is_dir() and directory.name.isdigit()
    ]


def _rank_end(directory: Path) -> RankEnd:
    rank = int(directory.name)
    try:
        doc = json.loads((directory / EXIT_RECORD).read_text(encoding="utf-8"))
        return RankEnd(rank, int(doc["exit"]), str(doc.get("error") or ""), float(doc["time"]))
    except (OSError, ValueError, KeyError, TypeError):
        written = [path.stat().st_mtime for path in directory.iterdir() if path.is_file()]
        return RankEnd(rank, None, "", max(written, default=0.0))
