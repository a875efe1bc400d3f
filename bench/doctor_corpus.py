"""The doctor's score on the corpus of real log excerpts, by failure kind, with every miss.

    .venv/bin/python bench/doctor_corpus.py
    .venv/bin/python bench/doctor_corpus.py --corpus tests/data/logs/corpus2   # another corpus directory

Exit 1 when a check is below 95% or a healthy log is called a failure (as the test requires).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from helpers.doctor_corpus import CHECKS, CORPUS, HEALTHY, cases, score, share, table  # noqa: E402

PASS_SHARE = 0.95


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=CORPUS, help="a directory of <id>.log + <id>.yaml cases")
    corpus = parser.parse_args(argv).corpus
    found = cases(corpus)
    if not found:
        print(f"no case in {corpus}", file=sys.stderr)
        return 2
    scores = [score(case) for case in found]
    print(table(scores))
    right = sum(not s.misses for s in scores)
    print(f"fully right: {right}/{len(scores)} ({right / len(scores):.0%})")
    for s in scores:
        if s.misses:
            print(f"miss {s.case.id} ({s.case.kind}, want {s.case.verdict}): {', '.join(s.misses)}; got {s.got}")
    ok = all(share(scores, c) >= PASS_SHARE for c in CHECKS)
    ok = ok and not [s for s in scores if s.case.verdict == HEALTHY and s.misses]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
