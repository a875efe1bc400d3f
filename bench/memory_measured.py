"""lmspec's training-memory estimate against one step measured on this CPU, every layout of the case list.

    .venv/bin/python bench/memory_measured.py [--case NAME ...] [--keep DIR]

Each case (tests/helpers/memory_cases.py: every backend, sharding, recompute kind and pipeline schedule
the CPU target trains) is compiled and trained through the runtime's own trainer for two steps on its
gloo ranks; step 2's peak of allocated bytes is measured exactly (tests/helpers/step_memory.py: live
storages at the step's start, the CPU allocator's events during it). Prints, per rank, the measured start
level and peak, the estimate of its pipeline stage by term, estimated allocated / measured peak and the op
running at the peak; then the least and greatest ratio per backend. The issue's target: every ratio in
[1.00, 1.10]. No constant of the estimate is fitted to these runs.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # helpers.memory_cases: the measurement the test runs

from helpers.memory_cases import BY_NAME, CASES, RankMemory, measure_case  # noqa: E402

from lmspec.compiler.models.train_memory import ALLOCATED_TERMS  # noqa: E402

MB = 1e6


def _row(r: RankMemory) -> str:
    e, m = r.estimate, r.measured
    terms = " ".join(f"{getattr(e, f'{t}_bytes') / MB:6.2f}" for t in ALLOCATED_TERMS)
    where = m["where"].rsplit(" > ", 2)[-2:]
    return (
        f"{r.case:24s} {r.rank:>4d} {m['stage']:>5d} {m['start'] / MB:7.2f} {m['peak'] / MB:7.2f} | {terms} "
        f"{e.allocated_bytes / MB:7.2f} {r.ratio:6.4f}  {' > '.join(where)}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", action="append", choices=sorted(BY_NAME), help="only these cases")
    parser.add_argument("--keep", type=Path, help="where the builds and measurements go (default a tmp dir)")
    args = parser.parse_args(argv)
    cases = [BY_NAME[name] for name in args.case] if args.case else list(CASES)
    root = args.keep or Path(tempfile.mkdtemp(prefix="lmspec-memory-"))
    header = " ".join(f"{t[:6]:>6s}" for t in ALLOCATED_TERMS)
    print(f"{'case':24s} rank stage   start    peak | {header} est.all  ratio  op at the peak (MB = 1e6 B)")
    ranks: list[RankMemory] = []
    for case in cases:
        for rank in measure_case(case, root):
            ranks.append(rank)
            print(_row(rank), flush=True)
    print()
    for backend in ("megatron", "deepspeed"):
        ratios = [r.ratio for r in ranks if r.case.startswith(backend)]
        if ratios:
            inside = sum(1.0 <= x <= 1.10 for x in ratios)
            print(
                f"{backend}: {len(ratios)} ranks, ratio {min(ratios):.3f}-{max(ratios):.3f}, {inside} in [1.00, 1.10]"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
