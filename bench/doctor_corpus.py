"""The doctor's score on the corpus of real log excerpts, by failure kind, with every miss.

    .venv/bin/python bench/doctor_corpus.py

Exit 1 when a check is below 95% or a healthy log is called a failure (as the test requires).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from helpers.doctor_corpus import CHECKS, HEALTHY, cases, score, share, table  # noqa: E402

PASS_SHARE = 0.95


def main() -> int:
    scores = [score(case) for case in cases()]
    print(table(scores))
    for s in scores:
        if s.misses:
            print(f"miss {s.case.id} ({s.case.kind}, want {s.case.verdict}): {', '.join(s.misses)}; got {s.got}")
    ok = all(share(scores, c) >= PASS_SHARE for c in CHECKS)
    ok = ok and not [s for s in scores if s.case.verdict == HEALTHY and s.misses]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
