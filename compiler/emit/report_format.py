"""How REPORT.md and report/memory.svg write each kind of number: one function per kind, so every
count, size, share and duration of the report reads the same way wherever it appears.

- counts (sequences, tokens, GPUs, bytes): thousands separators, no decimals;
- device memory: two decimals, in GiB (GB beside it), or in MiB (MB) for a table whose largest
  figure is under 1 GiB (the CPU presets), the unit chosen once per table or chart;
- storage (checkpoints): two decimals in the largest decimal unit (TB, GB, MB) with the binary
  figure beside it, as `df -H` and `df -h` print them;
- shares (MFU, splits, comm/compute): percentages with one decimal;
- durations: three significant digits below 100 s, whole seconds with separators above, minutes
  or hours beside a long one;
- rates (tokens/s): whole numbers with separators, three significant digits below 100;
- days: two decimals;
- FLOPs: three significant digits in e-notation.
"""

from __future__ import annotations

from dataclasses import dataclass

from lmspec.compiler.models.units import GB, GIB, MIB, SECONDS_PER_MINUTE, TB, gib

MB = 10**6
MEMORY_DECIMALS = 2  # every device-memory figure of the report: `52.08 GiB`
TIB = 2**40
SECONDS_PER_HOUR = 3600
LONG_S = 120  # a duration from this long on also reads in minutes
VERY_LONG_S = 2 * SECONDS_PER_HOUR  # ... and from this long on in hours


@dataclass(frozen=True)
class MemoryUnit:
    """A binary unit and its decimal twin, chosen once for a whole table or chart."""

    binary: str
    binary_bytes: int
    decimal: str
    decimal_bytes: int


GIB_UNIT = MemoryUnit("GiB", GIB, "GB", GB)
MIB_UNIT = MemoryUnit("MiB", MIB, "MB", MB)


def memory_unit(largest_bytes: float) -> MemoryUnit:
    """GiB, or MiB when the largest figure shown is under 1 GiB (two decimals of GiB would read 0.00)."""
    return GIB_UNIT if largest_bytes >= GIB else MIB_UNIT


def amount(n_bytes: float, unit: MemoryUnit = GIB_UNIT, decimal: bool = False) -> str:
    """`31.91`: bytes in `unit` (its decimal twin with decimal=True), two decimals."""
    return two_decimals(n_bytes / (unit.decimal_bytes if decimal else unit.binary_bytes))


def two_decimals(x: float) -> str:
    """`7,168.00`: a memory figure already in its unit (the chart's totals)."""
    return f"{x:,.{MEMORY_DECIMALS}f}"


def gib_gb(n_bytes: float) -> str:
    """`52.08 GiB (55.92 GB)`."""
    return f"{gib(n_bytes, MEMORY_DECIMALS)} ({amount(n_bytes, decimal=True)} GB)"


def storage(n_bytes: float) -> str:
    """`9.56 TB (8.69 TiB)`: a size on disk."""
    for decimal, d_bytes, binary, b_bytes in (("TB", TB, "TiB", TIB), ("GB", GB, "GiB", GIB)):
        if n_bytes >= d_bytes:
            return f"{n_bytes / d_bytes:,.2f} {decimal} ({n_bytes / b_bytes:,.2f} {binary})"
    return f"{n_bytes / MB:,.2f} MB ({n_bytes / MIB:,.2f} MiB)"


def count(n: float) -> str:
    """`62,914,560`."""
    return f"{n:,.0f}"


def percent(share: float) -> str:
    """`38.5%`."""
    return f"{share:.1%}"


def number(x: float) -> str:
    """A value without a unit of its own (seconds, tokens/s): three significant digits below 100, whole
    with separators above."""
    return f"{x:.3g}" if abs(x) < 100 else f"{x:,.0f}"


def seconds(s: float) -> str:
    """`8.08 s`, `956 s`, `7,327 s (2.04 h)`."""
    text = f"{number(s)} s"
    if s >= VERY_LONG_S:
        return f"{text} ({s / SECONDS_PER_HOUR:,.2f} h)"
    if s >= LONG_S:
        return f"{text} ({s / SECONDS_PER_MINUTE:,.1f} min)"
    return text


def rate(per_s: float) -> str:
    """`3,895,240`: tokens per second."""
    return number(per_s)


def days(n: float) -> str:
    """`2.97 days`, `1,081.00 days`."""
    return f"{n:,.2f} days"


def flops(x: float) -> str:
    """`2.60e+11`."""
    return f"{x:.2e}"
