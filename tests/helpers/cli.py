"""lmspec's CLI two ways: run in this process (the `lmspec` fixture returns a CliResult), or as the
installed console script a user types (LMSPEC), for tests that need a real process."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

LMSPEC = str(Path(sys.executable).with_name("lmspec"))


@dataclass
class CliResult:
    code: int
    out: str
    err: str

    def assert_reports(self, code: int, fragments: list[str]) -> None:
        """Exit `code`, every fragment on stderr, and no traceback: the golden-error contract."""
        assert self.code == code, self.err
        for fragment in fragments:
            assert fragment in self.err, f"missing {fragment!r} in:\n{self.err}"
        assert "Traceback" not in self.err
