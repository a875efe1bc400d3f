"""The runtime's logging: one call, `setup_logging`, at the start of each runtime process.

Every rank of a torchrun job writes the same libraries' warnings: megatron-core alone warns seven times at
import that Apex and Transformer Engine are missing, once per rank per launch. So, as torchtitan's
`init_logger` and Megatron-LM's `print_rank_0` do, the runtime logs through Python's `logging`:
- a line is prefixed with its global rank, `[rank3]: ` as torch's own C++ logs write it (so `lmspec logs` and
  `lmspec doctor` strip it with torchrun's), when the process is one of several (torchrun sets RANK and
  WORLD_SIZE); a single process gets no prefix;
- the level is LMSPEC_LOG_LEVEL (`lmspec run --quiet`: WARNING, default INFO, `--verbose`: DEBUG), exported so
  that torchrun's ranks, started by the launch scripts, inherit it; other libraries' loggers show warnings
  (their INFO too under --verbose);
- `warnings.warn` of any library is logged, and a third-party warning (a `warnings` warning or another
  library's WARNING record) is shown once per run: on global rank 0, the first time its text appears; the
  other ranks and the repeats log it at DEBUG (`--verbose` shows them);
- records below WARNING go to stdout and the rest to stderr, as the runtime's prints did, looked up at each
  record so that a replaced sys.stdout (pytest's capture) is the one written to.
lmspec's own messages keep their texts (`lmspec: saved ...`): `lmspec logs`, `lmspec doctor` and users' greps
read them.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from pathlib import Path
from typing import TextIO

from lmspec.compiler.errors import UsageError

LEVEL_ENV = "LMSPEC_LOG_LEVEL"
LEVELS = ("DEBUG", "INFO", "WARNING")  # --verbose, the default, --quiet
DEFAULT_LEVEL = "INFO"
OWN_LOGGER = "lmspec"  # the root of every runtime module's logger (`logging.getLogger(__name__)`)
WARNINGS_LOGGER = "py.warnings"  # the name logging.captureWarnings uses, so existing logging configs apply
_RESET_MARK = "_lmspec_console"  # marks the handler setup_logging installs, so a second call replaces it


def log_level(requested: str | None = None) -> str:
    """The level to run at: `requested` (a flag's), else $LMSPEC_LOG_LEVEL, else INFO; an unknown name is an error
    here rather than a silent INFO in every rank."""
    level = (requested or os.environ.get(LEVEL_ENV) or DEFAULT_LEVEL).upper()
    if level not in LEVELS:
        raise UsageError(f"{LEVEL_ENV}={level!r} is not a log level: use one of {', '.join(LEVELS)}")
    return level


def rank_prefix(env: dict[str, str] | os._Environ[str] = os.environ) -> str:
    """`[rankN]: ` for one process of several (torchrun's RANK and WORLD_SIZE), else nothing."""
    if env.get("RANK") is None or env.get("WORLD_SIZE", "1") == "1":
        return ""
    return f"[rank{env['RANK']}]: "


def global_rank(env: dict[str, str] | os._Environ[str] = os.environ) -> int:
    return int(env.get("RANK", "0"))


def is_own(record: logging.LogRecord) -> bool:
    return record.name == OWN_LOGGER or record.name.startswith(OWN_LOGGER + ".")


class OncePerRun(logging.Filter):
    """Passes a third-party warning the first time its text appears on global rank 0, and drops it on other
    ranks and on repeats unless `show_repeats` (--verbose). lmspec's own records and errors always pass.
    A `warnings` warning is keyed by its category and text, not its location: megatron-core says "Apex is not
    installed" from two modules."""

    def __init__(self, rank: int, show_repeats: bool) -> None:
        super().__init__()
        self.rank = rank
        self.show_repeats = show_repeats
        self.seen: set[tuple[str, str]] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if is_own(record) or record.levelno != logging.WARNING:
            return True
        key: tuple[str, str] = getattr(record, "once_key", (record.name, record.getMessage()))
        first = self.rank == 0 and key not in self.seen
        self.seen.add(key)
        return first or self.show_repeats


class RankFormatter(logging.Formatter):
    """lmspec's messages as they are; another library's as `<logger>: <level>: <message>`; a `warnings` warning
    as Python prints its first line. Each behind the rank prefix."""

    def __init__(self, prefix: str) -> None:
        super().__init__("%(message)s")
        self.prefix = prefix

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        if not is_own(record) and record.name != WARNINGS_LOGGER:
            text = f"{record.name}: {record.levelname.lower()}: {text}"
        return self.prefix + text


class ConsoleHandler(logging.Handler):
    """Below WARNING to stdout, the rest to stderr: whichever sys.stdout/sys.stderr is current."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            stream: TextIO = sys.stderr if record.levelno >= logging.WARNING else sys.stdout
            stream.write(self.format(record) + "\n")
            stream.flush()
        except Exception:  # logging's own contract: a failing handler reports, never raises into the caller
            self.handleError(record)


def _short(filename: str) -> str:
    """A warning's file from its package down (`megatron/core/optimizer/__init__.py`): the site-packages
    prefix is the same on every line and says nothing."""
    path = Path(filename)
    for entry in sorted((p for p in sys.path if p), key=len, reverse=True):
        if path.is_relative_to(entry):
            return str(path.relative_to(entry))
    return filename


def _log_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: TextIO | None = None,
    line: str | None = None,
) -> None:
    """warnings.showwarning's replacement: one record on the py.warnings logger, keyed for OncePerRun."""
    text = str(message)
    logging.getLogger(WARNINGS_LOGGER).warning(
        "%s:%d: %s: %s",
        _short(filename),
        lineno,
        category.__name__,
        text,
        extra={"once_key": (category.__name__, text)},
    )


def setup_logging(level: str | None = None, *, capture_warnings: bool = True) -> str:
    """Configure this process's logging (see the module docstring) and export the level to its children.
    Called again, it replaces its earlier handler. Returns the level. `capture_warnings=False` leaves
    `warnings` alone: for the `lmspec run` process, whose warnings are its own command's."""
    chosen = log_level(level)
    os.environ[LEVEL_ENV] = chosen
    numeric = logging.getLevelName(chosen)
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, _RESET_MARK, False)]:
        root.removeHandler(old)
    handler = ConsoleHandler()
    setattr(handler, _RESET_MARK, True)
    handler.setFormatter(RankFormatter(rank_prefix()))
    handler.addFilter(OncePerRun(global_rank(), show_repeats=chosen == "DEBUG"))
    root.addHandler(handler)
    root.setLevel(logging.INFO if chosen == "DEBUG" else logging.WARNING)
    logging.getLogger(OWN_LOGGER).setLevel(numeric)
    if capture_warnings:
        warnings.showwarning = _log_warning
    return chosen
