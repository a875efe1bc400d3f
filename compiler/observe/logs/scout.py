"""Which lines of a block may hold one of many needles: a few vectorised passes over its bytes.

Most lines of a big log are noise that no parser or signature reads; looking at each line in
Python is what made `lmspec logs`/`doctor` slow. The scout finds the few lines that can matter
without touching the others: the block's bytes are viewed as aligned byte pairs (numpy,
little-endian uint16), and every needle occurrence, whatever the parity of
where it starts, covers a known window of two consecutive aligned pairs. Two 64 Ki-entry tables
say, per pair value, which needle windows it can open (FIRST) or close (SECOND); a line is a
candidate when a pair and the next one share a window. Candidates are a superset of the lines
that hold a needle (windows are bit buckets shared by several needles; a line may be a candidate
for a needle it does not hold): readers check each candidate exactly. Needles are ASCII;
`ignore_case` needles match their ASCII case variants (re.IGNORECASE | re.ASCII).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from lmspec.compiler.observe.logs.reader import Block

_BUCKETS = 16  # bits of a uint16 table entry
_WILDCARD = -1
_PAD = b"\n" * 6  # past the end of a block: windows reaching over it see line breaks


@dataclass(frozen=True)
class Needle:
    text: bytes
    ignore_case: bool = False

    def __post_init__(self) -> None:
        if not self.text or not self.text.isascii():
            raise ValueError(f"a needle is non-empty ASCII: {self.text!r}")


def _windows(needle: Needle, parity: int) -> list[list[int]]:
    """Every 4-byte window (needle bytes, or wildcards past its ends) of two aligned pairs that an
    occurrence starting at an even (parity 0) or odd (parity 1) offset covers: offsets i..i+3 of
    the needle with i = parity mod 2, the first pair holding at least one needle byte."""
    text = needle.text
    return [
        [text[o] if 0 <= o < len(text) else _WILDCARD for o in range(start, start + 4)]
        for start in range(-1 if parity else 0, len(text), 2)
    ]


def _bytes_of(b: int, ignore_case: bool) -> list[int] | None:
    """The byte values a window position takes; None for a wildcard (any byte)."""
    if b == _WILDCARD:
        return None
    char = chr(b)
    if ignore_case and char.isalpha():
        return sorted({ord(char.lower()), ord(char.upper())})
    return [b]


def _pair_mask(low: list[int] | None, high: list[int] | None) -> np.ndarray:
    """256 x 256 booleans, [first byte, second byte]: the pair values a window pair can take."""
    mask = np.zeros((256, 256), dtype=bool)
    rows = np.arange(256) if low is None else np.array(low)
    columns = np.arange(256) if high is None else np.array(high)
    mask[np.ix_(rows, columns)] = True  # every first byte with every second byte
    return mask


class Scout:
    """The candidate lines of a block for a fixed set of needles.

    Which window of each needle is used, and which needles share a bucket, is chosen from the
    pair frequencies of the log itself (its first block, then again every RETUNE_BLOCKS): the
    rarest windows find the fewest noise lines. The choice changes speed only, never the result.
    """

    RETUNE_BLOCKS = 32

    def __init__(self, needles: Iterable[Needle]) -> None:
        self.needles = tuple(dict.fromkeys(needles))
        self._first = np.zeros(1 << 16, dtype=np.uint16)
        self._second = np.zeros(1 << 16, dtype=np.uint16)
        self._opens = np.zeros(1 << 16, dtype=np.uint8)  # pair values that open any window
        self._in_bucket: list[list[int]] = [[] for _ in range(_BUCKETS)]  # needle indices per bucket
        self._by_mask: dict[int, tuple[Needle, ...]] = {}
        self._seen = 0

    def _tune(self, pairs: np.ndarray) -> None:
        counts = np.bincount(pairs, minlength=1 << 16).reshape(256, 256).T  # [first byte, second byte]
        share = (counts + 0.5) / (len(pairs) + 0.5 * (1 << 16))
        by_first, by_second = share.sum(axis=1), share.sum(axis=0)

        def chance(low: list[int] | None, high: list[int] | None) -> float:
            """P(an aligned pair takes one of these values)."""
            if low is None:
                return 1.0 if high is None else float(by_second[high].sum())
            return float(by_first[low].sum()) if high is None else float(share[np.ix_(low, high)].sum())

        combos = []  # (P(first), P(second), needle index, window byte sets)
        for index, needle in enumerate(self.needles):
            for parity in (0, 1):
                options: list[Any] = []
                for w in _windows(needle, parity):
                    pos = [_bytes_of(b, needle.ignore_case) for b in w]
                    p_first, p_second = chance(pos[0], pos[1]), chance(pos[2], pos[3])
                    options.append((p_first * p_second, len(options), pos, p_first, p_second))
                _, _, pos, p_first, p_second = min(options)
                combos.append((p_first, p_second, index, pos))
        first_table = np.zeros((256, 256), dtype=np.uint16)
        second_table = np.zeros((256, 256), dtype=np.uint16)
        loads = [(0.0, 0.0)] * _BUCKETS  # P(FIRST), P(SECOND) of each bucket
        self._in_bucket = [[] for _ in range(_BUCKETS)]
        self._by_mask = {}
        for p_first, p_second, index, pos in sorted(combos, key=lambda c: (-c[0] * c[1], c[2])):

            def added(b: int, pf: float = p_first, ps: float = p_second) -> float:
                f, s = loads[b]
                return min(1.0, f + pf) * min(1.0, s + ps) - f * s

            bucket = min(range(_BUCKETS), key=added)  # where this window adds the least chance of a false hit
            f, s = loads[bucket]
            loads[bucket] = (min(1.0, f + p_first), min(1.0, s + p_second))
            self._in_bucket[bucket].append(index)
            first_table[_pair_mask(pos[0], pos[1])] |= np.uint16(1 << bucket)
            second_table[_pair_mask(pos[2], pos[3])] |= np.uint16(1 << bucket)
        # uint16 pair value = first byte | second byte << 8: the table indexed [second, first], flattened
        self._first = np.ascontiguousarray(first_table.T).reshape(-1)
        self._second = np.ascontiguousarray(second_table.T).reshape(-1)
        self._opens = (self._first != 0).view(np.uint8)

    def candidates(self, block: Block) -> tuple[np.ndarray, np.ndarray]:
        """The block's lines that may hold a needle (sorted indices) and, per line, a mask to
        pass to `needles_in`: which needles that line may hold."""
        data = block.data + _PAD[: 4 + len(block.data) % 2]
        pairs = np.frombuffer(data, dtype="<u2")
        if self._seen % self.RETUNE_BLOCKS == 0:
            self._tune(pairs)
        self._seen += 1
        opening = np.flatnonzero(self._opens.take(pairs[:-1]).view(np.bool_))
        masks = self._first.take(pairs.take(opening)) & self._second.take(pairs.take(opening + 1))
        hit = masks != 0
        at, masks = opening[hit] * 2, masks[hit]
        if not len(at):
            return at, masks
        # a pair's two bytes may lie in two lines (a break between them): both are candidates
        lines = np.searchsorted(block.ends, np.concatenate((at, at + 1)), side="left")
        masks = np.concatenate((masks, masks))
        order = np.argsort(lines, kind="stable")
        lines, masks = lines[order], masks[order]
        starts = np.flatnonzero(np.diff(lines, prepend=-1))
        unique, merged = lines[starts], np.bitwise_or.reduceat(masks, starts)
        inside = unique < len(block)
        return unique[inside], merged[inside]

    def lines(self, block: Block) -> np.ndarray:
        """Indices (sorted, unique) of the block's lines that may hold a needle."""
        return self.candidates(block)[0]

    def needles_in(self, mask: int) -> tuple[Needle, ...]:
        """The needles whose windows use the buckets of a candidate's mask."""
        needles = self._by_mask.get(mask)
        if needles is None:
            indices = sorted({i for b in range(_BUCKETS) if mask >> b & 1 for i in self._in_bucket[b]})
            needles = self._by_mask[mask] = tuple(self.needles[i] for i in indices)
        return needles
