"""Reading a log file in bounded memory: blocks of whole lines, never the whole file.

A log is read READ_BYTES at a time into blocks of complete lines (a line's end is ``\\n``,
``\\r\\n`` or ``\\r``: what `bytes.splitlines` and a terminal's progress-bar redraws use; each
``\\r`` redraw is a line of its own, as `lmspec logs`/`doctor` numbered them before). A block
keeps its bytes and the span of every line (numpy arrays, found in one vectorised pass), and a
line is decoded (UTF-8, bad bytes replaced) only when a reader asks for it. Memory is a block
plus one partial line, whatever the file's size.

A line longer than MAX_LINE_BYTES is read as its first MAX_LINE_BYTES (its tail is skipped, the
line numbering is unchanged) and counted in `LogFile.long_lines`, so a file with no newline
does not become one string. What is not a regular file (a FIFO, a device) is refused before
reading, so nothing blocks; gzip-compressed logs are read through gzip; other compressed or
binary files are refused with what they look like.
"""

from __future__ import annotations

import gzip
import io
import os
import stat
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, cast

import numpy as np

from lmspec.compiler.errors import UsageError

READ_BYTES = 1 << 20
MAX_LINE_BYTES = 1 << 16  # 64 KiB: a log line longer than this is read as its first 64 KiB
SNIFF_BYTES = 1 << 16
BINARY_CONTROL_SHARE = 0.02  # more control bytes than this in the first 64 KiB: not a text log
_CR, _LF = 13, 10
# bytes that are neither text nor the whitespace/escape controls a log carries (\t \n \v \f \r ESC)
_CONTROL = bytes([*range(0, 9), *range(14, 27), *range(28, 32), 127])
_MAGIC: tuple[tuple[bytes, str, str], ...] = (
    (b"\x28\xb5\x2f\xfd", "zstd-compressed", "zstd -d"),
    (b"\xfd7zXZ\x00", "xz-compressed", "xz -d"),
    (b"BZh", "bzip2-compressed", "bzip2 -d"),  # + a block size digit and the block magic, below
    (b"PK\x03\x04", "a zip archive", "unzip"),
    (b"\x04\x22\x4d\x18", "lz4-compressed", "lz4 -d"),
)
_GZIP_MAGIC = b"\x1f\x8b"


@dataclass(frozen=True)
class Block:
    """Complete lines of a log: `data[starts[i]:ends[i]]` is line `first_line + i` (no line break)."""

    data: bytes
    first_line: int  # 1-based number of the block's first line
    starts: np.ndarray  # int64
    ends: np.ndarray  # int64, exclusive, the line break not included

    def __len__(self) -> int:
        return len(self.starts)

    def raw(self, i: int) -> bytes:
        start = int(self.starts[i])
        return self.data[start : min(int(self.ends[i]), start + MAX_LINE_BYTES)]

    def line(self, i: int) -> str:
        """Line i of the block as text (UTF-8; bytes that are not UTF-8 replaced), at most MAX_LINE_BYTES."""
        return self.raw(i).decode("utf-8", errors="replace")

    def lines(self) -> list[str]:
        """Every line of the block as text: the block decoded at once when no line is too long."""
        if self.long_lines():
            return [self.line(i) for i in range(len(self))]
        text = self.data.replace(b"\r\n", b"\n").replace(b"\r", b"\n").decode("utf-8", errors="replace")
        lines = text.split("\n")
        return lines[:-1] if self.data[-1:] in (b"\n", b"\r") else lines

    def long_lines(self) -> int:
        return int(np.count_nonzero((self.ends - self.starts) > MAX_LINE_BYTES))


def block_of(data: bytes, first_line: int) -> Block:
    """The block for `data`, which ends with a line break (or is one unterminated last line)."""
    view = np.frombuffer(data, dtype=np.uint8)
    has_cr = b"\r" in data
    if not has_cr:  # most logs: \n alone ends a line
        terminators = np.flatnonzero(view == _LF)
    else:  # one comparison finds both (and the rare tab or form feed, dropped after)
        breaks = np.flatnonzero(view <= _CR)
        breaks = breaks[(view[breaks] == _LF) | (view[breaks] == _CR)]
        after = np.minimum(breaks + 1, len(view) - 1)
        # the \r of a \r\n ends no line of its own; the \n after it does
        cr_of_crlf = (view[breaks] == _CR) & (breaks + 1 < len(view)) & (view[after] == _LF)
        terminators = breaks[~cr_of_crlf]
    if not len(terminators) or terminators[-1] != len(view) - 1:
        terminators = np.append(terminators, len(view))  # an unterminated last line
    starts = np.empty(len(terminators), dtype=np.int64)
    starts[0] = 0
    starts[1:] = terminators[:-1] + 1
    ends = terminators.astype(np.int64)
    if has_cr:  # a line ended by \r\n ends before its \r
        inside = ends < len(view)
        crlf = np.zeros(len(ends), dtype=bool)
        at = ends[inside]
        crlf[inside] = (view[at] == _LF) & (at > starts[inside]) & (view[np.maximum(at - 1, 0)] == _CR)
        ends -= crlf
    return Block(data=data, first_line=first_line, starts=starts, ends=ends)


class LogFile:
    """One log, opened: its blocks of lines, read once per call of `blocks()`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.long_lines = 0
        self.line_count = 0
        self._check_openable()

    def _open(self) -> BinaryIO:
        """The file's bytes (decompressed when gzip); refuses what is not a regular text file."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        except OSError as exc:
            raise UsageError(f"{self.path}: cannot open the log ({exc.strerror})") from None
        try:
            mode = os.fstat(fd).st_mode
            if not stat.S_ISREG(mode):
                kinds = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISDIR, "a directory"), (stat.S_ISSOCK, "a socket"))
                kind = next((name for test, name in kinds if test(mode)), "a device")
                raise UsageError(f"{self.path} is {kind}, not a log file; save the output to a file and pass that")
            os.set_blocking(fd, True)
            raw: BinaryIO = os.fdopen(fd, "rb", buffering=0)
        except BaseException:
            os.close(fd)
            raise
        try:
            head = raw.read(4)
            raw.seek(0)
        except OSError as exc:
            raw.close()
            raise UsageError(f"{self.path}: cannot read the log ({exc.strerror})") from None
        if head.startswith(_GZIP_MAGIC):
            return cast(BinaryIO, _Gunzip(raw))
        return raw

    def _check_openable(self) -> None:
        stream = self._open()
        try:
            head = self._read(stream, SNIFF_BYTES)
        finally:
            stream.close()
        for magic, what, tool in _MAGIC:
            if head.startswith(magic) and (magic != b"BZh" or head[4:10] in (b"1AY&SY", b"\x17rE8P\x90")):
                raise UsageError(f"{self.path} is {what}; decompress it first ({tool} {self.path.name})")
        control = len(head) - len(head.translate(None, _CONTROL))
        if head and control > BINARY_CONTROL_SHARE * len(head):
            raise UsageError(
                f"{self.path} is not a text log ({control} of its first {len(head)} bytes are binary "
                "control bytes); pass the training or serving log itself"
            )

    def _read(self, stream: BinaryIO, size: int) -> bytes:
        try:
            return stream.read(size)
        except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
            raise UsageError(f"{self.path}: damaged gzip data ({exc}); decompress what is left with zcat") from None
        except OSError as exc:
            raise UsageError(f"{self.path}: cannot read the log ({exc.strerror or exc})") from None

    def blocks(self) -> Iterator[Block]:
        """Every line of the log, in blocks; sets `line_count` and `long_lines` when done."""
        self.long_lines = 0
        line = 1
        carry = b""  # the start of a line whose end is not read yet
        skipping = False  # in a line longer than MAX_LINE_BYTES, past what is kept of it
        drop_lf = False  # a kept overlong line ended with \r: a \n right after it belongs to it
        stream = self._open()
        try:
            while True:
                data = self._read(stream, READ_BYTES)
                if not data:
                    break
                if drop_lf:
                    data, drop_lf = (data[1:] if data[:1] == b"\n" else data), False
                if skipping:
                    cut = _first_break(data)
                    if cut < 0:
                        continue
                    skipping = False
                    if data[cut] == _CR:
                        if cut + 1 == len(data):
                            drop_lf = True
                        elif data[cut + 1] == _LF:
                            cut += 1
                    data = data[cut + 1 :]
                buffer = carry + data if carry else data
                end = _last_certain_break(buffer)
                carry = buffer[end:]
                if end:
                    block = block_of(buffer[:end], line)
                    self.long_lines += block.long_lines()
                    line += len(block)
                    yield block
                ended_by_cr = carry.endswith(b"\r")
                if len(carry) - ended_by_cr > MAX_LINE_BYTES:  # keep its head as the line; skip to its end
                    block = block_of(carry[:MAX_LINE_BYTES] + b"\n", line)
                    self.long_lines += 1
                    line += 1
                    yield block
                    carry, skipping, drop_lf = b"", not ended_by_cr, ended_by_cr
            if carry:
                block = block_of(carry[:-1] if carry.endswith(b"\r") else carry, line)
                line += len(block)
                yield block
        finally:
            stream.close()
        self.line_count = line - 1

    def lines(self) -> Iterator[str]:
        """Every line as text, in order (for readers that look at each line)."""
        for block in self.blocks():
            yield from block.lines()


class MemoryLog(LogFile):
    """Lines already in memory (each without its line break), read like a log file."""

    def __init__(self, lines: Iterable[str], name: str = "<lines>") -> None:
        self.path = Path(name)
        self.long_lines = 0
        self.line_count = 0
        self._data = b"".join(line.encode("utf-8", errors="surrogateescape") + b"\n" for line in lines)

    def _open(self) -> BinaryIO:
        return io.BytesIO(self._data)


class _Gunzip(gzip.GzipFile):
    """gzip over an opened file that closes that file too (GzipFile leaves a fileobj open)."""

    def __init__(self, raw: BinaryIO) -> None:
        super().__init__(fileobj=raw, mode="rb")
        self._raw = raw

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._raw.close()


def _first_break(data: bytes) -> int:
    found = [i for i in (data.find(b"\n"), data.find(b"\r")) if i >= 0]
    return min(found) if found else -1


def _last_certain_break(buffer: bytes) -> int:
    """Length of the buffer's complete lines: up to its last line break, where a \\r as the very
    last byte does not count yet (the next read may bring the \\n of a \\r\\n)."""
    limit = len(buffer) - 1 if buffer.endswith(b"\r") else len(buffer)
    return max(buffer.rfind(b"\n", 0, limit), buffer.rfind(b"\r", 0, limit)) + 1
