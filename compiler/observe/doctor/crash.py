"""An unrecognised failure: the log shows a Python traceback or a non-zero exit that no known
signature explains. Never "healthy": the finding quotes the exception the run died of.

torchrun prints each rank's traceback (behind its ``[rank0]:`` prefix), then its own
ChildFailedError traceback with ``exitcode  : 1`` (torch/distributed/elastic/multiprocessing/
errors/__init__.py); the root cause is the first exception after the first traceback, so that is
the line quoted. An excerpt cut below the ``Traceback`` header still shows its frames (``File
"...", line 12, in main``): the first frame stands in for the header. `diagnose` runs this only
when no signature of the table matched.
"""

from __future__ import annotations

import re

from lmspec.compiler.observe.doctor.findings import Finding, LogText, Watch

_EXCEPTION_WORDS = (b"Error", b"Exception", b"Exit", b"Interrupt", b"Failure")
TRACEBACK = Watch(re.compile(r"Traceback \(most recent call last\)"), needles=(b"Traceback",), keep=1)
FRAME = Watch(re.compile(r'^\s*File "[^"]+", line \d+, in \S'), needles=(b'File "',), keep=1)
# `ValueError: msg`, `megatron.core.Foo.BarError: msg`, a bare `AssertionError`, as Python prints the last line
EXCEPTION = Watch(
    re.compile(r"^\s*((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt|Failure))(?::.*)?$"),
    needles=_EXCEPTION_WORDS,
    keep=16,
)
# torchrun's `exitcode  : 1 (pid: 4821)` / `failed (exitcode: 1)`, a shell's `exited with code 1`
NONZERO_EXIT = Watch(
    re.compile(r"\bexit ?code\s*:?\s*(-?[1-9]\d*)|\bexited with (?:exit )?(?:code|status) (-?[1-9]\d*)", re.I | re.A),
    needles=(b"exit",),
    keep=1,
)


class UnrecognisedFailure:
    name = "unrecognised_failure"
    watches = (TRACEBACK, FRAME, EXCEPTION, NONZERO_EXIT)

    def detect(self, log: LogText) -> Finding | None:
        traceback = log.find(TRACEBACK.pattern, 1) or log.find(FRAME.pattern, 1)
        exit_line = log.find(NONZERO_EXIT.pattern, 1)
        if not traceback and not exit_line:
            return None
        after = traceback[0][0].line if traceback else 0
        raised = [hit for hit in log.find(EXCEPTION.pattern, EXCEPTION.keep) if hit[0].line > after][:1]
        evidence = [hit[0] for hit in (*traceback, *raised, *exit_line)]
        if raised:
            died = f"the exception `{raised[0][1].group(0).strip()}`"
        else:
            died = f"a non-zero exit ({exit_line[0][0].text})" if exit_line else "a traceback"
        cause = (
            f"The run failed with {died}, and no known failure signature matches it. Read the evidence "
            "lines in the log; if `lmspec check` accepted the spec, a crash like this is a bug of lmspec."
        )
        return Finding(self.name, "unrecognised failure", cause, tuple(evidence), ())
