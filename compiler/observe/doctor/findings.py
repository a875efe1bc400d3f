"""A finding (cause, evidence lines, spec keys to change) and the log text signatures search:
one streaming pass over the log for every signature's watched patterns at once."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from lmspec.compiler.errors import UsageError
from lmspec.compiler.observe.logs.context import RunContext
from lmspec.compiler.observe.logs.launcher import strip_prefix
from lmspec.compiler.observe.logs.reader import LogFile, MemoryLog
from lmspec.compiler.observe.logs.scout import Needle, Scout
from lmspec.compiler.observe.metrics_record import StepMetrics

MAX_EVIDENCE_LINES = 4  # per pattern: enough to see ranks and values, not a whole log
_MAX_LINE_CHARS = 240
_CONTEXT_CHARS = 80  # kept before the match in a clipped line
_MAX_TRIES = 64  # more start words than this on a line: one search() from the first is quicker
_ASCII_LOWER = {c: c + 32 for c in range(ord("A"), ord("Z") + 1)}  # str.translate: length kept, unlike lower()


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


@dataclass(frozen=True)
class Watch:
    """A pattern signatures look for in every line, with the words no match can do without.

    `needles` are ASCII byte strings of which every line the pattern matches holds at least one
    (case-insensitively when the pattern is re.IGNORECASE, which must come with re.ASCII): the
    scout (compiler/observe/logs/scout.py) skips every other line without decoding it. `keep` first hits
    are kept as evidence, every hit is counted, and with `last_where` the last hit passing it too.
    """

    pattern: re.Pattern[str]
    needles: tuple[bytes, ...]
    keep: int = MAX_EVIDENCE_LINES
    last_where: Callable[[re.Match[str]], bool] | None = None
    # Every match begins with one of these words (when given): the pattern is tried only there,
    # the leftmost first, which finds what search() finds without trying every position of a
    # line. A word may come as (word, skip): after a failed try at it, its next occurrences up to
    # where `skip` matches after the word fail too and are not tried (".*" for a branch that
    # reads to the end of the line): no pattern costs more than linear time on a long line.
    starts: tuple[bytes | tuple[bytes, str], ...] = ()
    # Remember its latest match at each kept hit of any watch: last_match_before() then needs
    # no second pass over the log.
    track: bool = False
    ignore_case: bool = field(init=False)  # from the pattern's flags
    # `starts` as text (lowered when ignore_case), each with its compiled skip pattern or None
    _words: tuple[tuple[str, re.Pattern[str] | None], ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        ignore_case = bool(self.pattern.flags & re.IGNORECASE)
        if ignore_case and not self.pattern.flags & re.ASCII:
            raise ValueError(f"{self.pattern.pattern!r}: an IGNORECASE watch needs re.ASCII (its needles are ASCII)")
        words = []
        for start in self.starts:
            word, skip = start if isinstance(start, tuple) else (start, None)
            text = word.decode().lower() if ignore_case else word.decode()
            words.append((text, re.compile(skip) if skip is not None else None))
        object.__setattr__(self, "ignore_case", ignore_case)
        object.__setattr__(self, "_words", tuple(words))

    def search(self, text: str) -> re.Match[str] | None:
        if not self._words:
            return self.pattern.search(text)
        hay = text if not self.ignore_case else text.lower() if text.isascii() else text.translate(_ASCII_LOWER)
        tries: list[tuple[int, int]] = []  # (position, index of the word found there)
        for index, (word, _) in enumerate(self._words):
            found = hay.find(word)
            while found >= 0:
                tries.append((found, index))
                found = hay.find(word, found + 1)
        if not tries:
            return None
        tries.sort()
        if len(tries) > _MAX_TRIES and all(skip is None for _, skip in self._words):
            return self.pattern.search(text, tries[0][0])  # the same match: none starts earlier
        skip_until = [0] * len(self._words)
        for position, index in tries:
            if position < skip_until[index]:
                continue
            match = self.pattern.match(text, position)
            if match:
                return match
            word, skip = self._words[index]
            if skip is not None:
                skipped = skip.match(text, position + len(word))
                skip_until[index] = skipped.end() if skipped else 0
        return None

    def scout_needles(self) -> list[Needle]:
        return [Needle(n.lower() if self.ignore_case else n, self.ignore_case) for n in self.needles]


Hit = tuple[Evidence, re.Match[str]]


@dataclass
class _Seen:
    first: list[Hit] = field(default_factory=list)
    count: int = 0
    last: Hit | None = None


class LogText:
    """What the watched patterns found in a log, from one pass over it: per pattern its first
    hits (evidence), their count and optionally its last hit. Lines are searched with launcher
    prefixes stripped and quoted as written (rank prefix kept). `line`, `last_match_before` and
    `steps` read the log again, for the few findings that need more than their hits.

    `LogText(lines)` scans lines already in memory (each without its line break);
    `LogText.scan(log_file, watches)` a log on disk, block by block.
    """

    _lines: list[str] | None  # held only when made from lines in memory; read again from the file otherwise

    def __init__(self, raw_lines: list[str], watches: Sequence[Watch] | None = None) -> None:
        if watches is None:
            from lmspec.compiler.observe.doctor import WATCHES

            watches = WATCHES
        self._lines = [strip_prefix(line) for line in raw_lines]
        self._scan(MemoryLog(raw_lines), watches)

    @classmethod
    def scan(cls, source: LogFile, watches: Sequence[Watch]) -> LogText:
        log = cls.__new__(cls)
        log._lines = None
        log._scan(source, watches)
        return log

    def _scan(self, source: LogFile, watches: Sequence[Watch]) -> None:
        self.source = source
        self._seen: dict[re.Pattern[str], _Seen] = {w.pattern: _Seen() for w in watches}
        # tracked watches first on each line: a hit's snapshot includes its own line
        watches = sorted(watches, key=lambda w: not w.track)
        self._tracked = [w for w in watches if w.track]
        self._latest: dict[re.Pattern[str], re.Match[str]] = {}  # tracked pattern -> its latest match
        self._at_hit: dict[int, dict[re.Pattern[str], re.Match[str]]] = {}  # kept hit line -> latest matches
        self._kept_at: dict[int, int] = {}  # line -> how many kept hits are on it (snapshots are dropped at 0)
        by_needle: dict[Needle, list[int]] = {}  # needle -> indices of the watches it stands for
        for index, watch in enumerate(watches):
            for needle in watch.scout_needles():
                by_needle.setdefault(needle, []).append(index)
        scout = Scout(by_needle)
        for block in source.blocks():
            lines, masks = scout.candidates(block)
            for i, mask in zip(lines.tolist(), masks.tolist(), strict=True):
                raw_bytes = block.raw(i)
                lowered = None
                found: set[int] = set()
                for needle in scout.needles_in(mask):
                    if needle.ignore_case:
                        lowered = raw_bytes.lower() if lowered is None else lowered
                        holds = needle.text in lowered
                    else:
                        holds = needle.text in raw_bytes
                    if holds:
                        found.update(by_needle[needle])
                if found:  # in watch order: the tracked ones first
                    text = raw_bytes.decode("utf-8", errors="replace")
                    self._see(block.first_line + i, text, [watches[w] for w in sorted(found)])
        self.line_count = source.line_count
        self.long_lines = source.long_lines

    def _see(self, number: int, raw: str, watches: list[Watch]) -> None:
        text = strip_prefix(raw)
        for watch in watches:
            match = watch.search(text)
            if match is None:
                continue
            if watch.track:
                self._latest[watch.pattern] = match
            seen = self._seen[watch.pattern]
            seen.count += 1
            first = len(seen.first) < watch.keep
            last = watch.last_where is not None and watch.last_where(match)
            if not first and not last:
                continue
            hit = (Evidence(number, _clip(raw, len(raw) - len(text) + match.start())), match)
            kept = 0
            if first:
                seen.first.append(hit)
                kept += 1
            if last:
                if seen.last is not None:
                    self._release(seen.last[0].line)
                seen.last = hit
                kept += 1
            if kept and self._tracked:
                self._kept_at[number] = self._kept_at.get(number, 0) + kept
                self._at_hit[number] = dict(self._latest)

    def _release(self, line: int) -> None:
        """A kept hit on `line` was replaced: drop the line's snapshot when no kept hit is left on it."""
        if line in self._kept_at:
            self._kept_at[line] -= 1
            if not self._kept_at[line]:
                del self._kept_at[line], self._at_hit[line]

    def _watched(self, pattern: re.Pattern[str]) -> _Seen:
        try:
            return self._seen[pattern]
        except KeyError:
            raise KeyError(f"{pattern.pattern!r} is not watched: add its Watch to the signature's watches") from None

    def find(self, pattern: re.Pattern[str], limit: int = MAX_EVIDENCE_LINES) -> list[Hit]:
        """The first `limit` lines the pattern matches (at most its watch's `keep`), in log order."""
        return self._watched(pattern).first[:limit]

    def count(self, pattern: re.Pattern[str]) -> int:
        return self._watched(pattern).count

    def last(self, pattern: re.Pattern[str]) -> Hit | None:
        """The last hit that passed its watch's `last_where`."""
        return self._watched(pattern).last

    @property
    def lines(self) -> list[str]:
        """Every line, prefixes stripped: only for a LogText made from lines in memory."""
        if self._lines is None:
            raise TypeError("a scanned log file keeps no lines; use line(number)")
        return self._lines

    def line(self, number: int) -> str:
        """Line `number` (1-based), launcher prefix stripped: read again from the log."""
        for block in self.source.blocks():
            if number < block.first_line + len(block):
                return strip_prefix(block.line(number - block.first_line))
        raise UsageError(f"{self.source.path}: the log changed while it was read (line {number} is gone); run again")

    def joined(self, number: int, count: int) -> str:
        """Lines `number`.. `number + count - 1` (as many as the log has), prefixes stripped, joined by
        spaces: a message a console wrapped over several lines, read as one."""
        last = min(number + count - 1, self.line_count)
        return " ".join(self.line(n).strip() for n in range(number, last + 1))

    def unwrapped(self, number: int, count: int) -> str:
        """Lines `number`.. `number + count - 1` (as many as the log has), prefixes stripped, joined with
        nothing between them: a message a terminal hard-wrapped at its width, mid-word too, read as one (a
        pattern read on it allows no space where a wrap at a space may have lost it). One pass over the log."""
        parts: list[str] = []
        for block in self.source.blocks():
            for i in range(max(number - block.first_line, 0), len(block)):
                if block.first_line + i >= number + count:
                    return "".join(parts)
                parts.append(strip_prefix(block.line(i)))
        return "".join(parts)

    def last_match_before(self, watch: Watch, line: int) -> re.Match[str] | None:
        """The last match of a watch's pattern at or before a line: from the scan when the watch is
        tracked and the line is one of the hits kept, else read again from the log up to it."""
        if watch.track and line in self._at_hit:
            return self._at_hit[line].get(watch.pattern)
        scout = Scout(watch.scout_needles())
        last = None
        for block in self.source.blocks():
            if block.first_line > line:
                break
            for i in scout.lines(block).tolist():
                if block.first_line + i > line:
                    break
                match = watch.search(strip_prefix(block.line(i)))
                last = match or last
        return last

    def steps(self) -> Iterator[StepMetrics]:
        """The log's steps as `lmspec logs` reads them: reads the log again."""
        from lmspec.compiler.observe.logs.parse import parse_source

        return parse_source(self.source, str(self.source.path)).records()


def _clip(text: str, match_at: int) -> str:
    """The line, or a window of it that starts shortly before what matched."""
    text = text.rstrip()
    if len(text) <= _MAX_LINE_CHARS:
        return text.strip()
    start = max(0, min(match_at - _CONTEXT_CHARS, len(text) - _MAX_LINE_CHARS))
    window = text[start : start + _MAX_LINE_CHARS]
    return ("..." if start else "") + window + ("..." if start + _MAX_LINE_CHARS < len(text) else "")


class Signature(Protocol):
    """A known failure: `detect` returns a Finding when the log shows it, else None. `watches`
    are the patterns `detect` reads from the LogText."""

    @property
    def name(self) -> str: ...  # read-only members: a class attribute of each signature satisfies them
    @property
    def watches(self) -> tuple[Watch, ...]: ...

    def detect(self, log: LogText, context: RunContext | None) -> Finding | None: ...
