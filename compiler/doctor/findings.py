"""A finding (cause, evidence lines, spec keys to change) and the log text signatures search."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Protocol

from compiler.logs.context import RunContext
from compiler.logs.launcher import strip_prefix

MAX_EVIDENCE_LINES = 4  # per pattern: enough to see ranks and values, not a whole log
_MAX_LINE_CHARS = 240
_CONTEXT_CHARS = 80  # kept before the match in a clipped line


@dataclass(frozen=True)
class Evidence:
    line: int  # 1-based line of the log; 0 for evidence from the build (plan.json)
    text: str


@dataclass(frozen=True)
class Fix:
    """One spec key and the value to give it (or what to do with it), and why."""

    key: str
    value: str
    why: str

    def line(self) -> str:
        return f"{self.key}={self.value}  # {self.why}"


@dataclass(frozen=True)
class Finding:
    signature: str
    title: str
    cause: str
    evidence: tuple[Evidence, ...]
    fixes: tuple[Fix, ...]

    def text(self) -> str:
        lines = [f"problem: {self.title} [{self.signature}]", f"  cause: {self.cause}", "  evidence:"]
        lines += [f"    L{e.line}: {e.text}" if e.line else f"    {e.text}" for e in self.evidence]
        lines.append("  change:" if self.fixes else "  change: nothing in the spec; see the cause")
        lines += [f"    {fix.line()}" for fix in self.fixes]
        return "\n".join(lines)


class LogText:
    """The log's lines, searched with launcher prefixes stripped, quoted as written (rank prefix kept)."""

    def __init__(self, raw_lines: list[str]) -> None:
        self.raw_lines = raw_lines
        self.lines = [strip_prefix(line) for line in raw_lines]

    def find(self, pattern: re.Pattern[str], limit: int = MAX_EVIDENCE_LINES) -> list[tuple[Evidence, re.Match[str]]]:
        hits = []
        for number, text in enumerate(self.lines, start=1):
            match = pattern.search(text)
            if match:
                raw = self.raw_lines[number - 1]
                hits.append((Evidence(number, _clip(raw, len(raw) - len(text) + match.start())), match))
                if len(hits) >= limit:
                    break
        return hits

    def find_all(self, pattern: re.Pattern[str]) -> list[tuple[Evidence, re.Match[str]]]:
        return self.find(pattern, limit=len(self.lines))


def _clip(text: str, match_at: int) -> str:
    """The line, or a window of it that starts shortly before what matched."""
    text = text.rstrip()
    if len(text) <= _MAX_LINE_CHARS:
        return text.strip()
    start = max(0, min(match_at - _CONTEXT_CHARS, len(text) - _MAX_LINE_CHARS))
    window = text[start : start + _MAX_LINE_CHARS]
    return ("..." if start else "") + window + ("..." if start + _MAX_LINE_CHARS < len(text) else "")


class Signature(Protocol):
    """A known failure: `detect` returns a Finding when the log shows it, else None."""

    name: str

    def detect(self, log: LogText, context: RunContext | None) -> Finding | None: ...
