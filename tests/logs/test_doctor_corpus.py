"""`lmspec doctor` scored on real excerpts from public issue threads (tests/data/logs/corpus):
at least 95% right on every check, and no healthy log called a failure."""

from __future__ import annotations

import pytest
from helpers.doctor_corpus import CHECKS, HEALTHY, cases, score, share, table

pytestmark = pytest.mark.slow
PASS_SHARE = 0.95
MIN_CASES = 50


def test_corpus_scores_at_least_95_percent_on_every_check() -> None:
    scores = [score(case) for case in cases()]
    assert scores, "tests/data/logs/corpus holds no case"
    misses = "\n".join(f"{s.case.id} ({s.case.kind}): {', '.join(s.misses)}; got {s.got}" for s in scores if s.misses)
    report = f"{table(scores)}\n{misses}"
    assert {check: share(scores, check) >= PASS_SHARE for check in CHECKS} == dict.fromkeys(CHECKS, True), report
    assert [s.case.id for s in scores if s.case.verdict == HEALTHY and s.misses] == [], report


def test_corpus_holds_at_least_50_cases() -> None:
    assert len(cases()) >= MIN_CASES


def test_every_case_names_its_source_and_a_known_verdict() -> None:
    from lmspec.compiler.observe.doctor import SIGNATURES, UNRECOGNISED

    known = {s.name for s in SIGNATURES} | {UNRECOGNISED.name, HEALTHY}
    for case in cases():
        assert case.log.is_file(), case.id
        assert case.source.startswith(("https://", "lmspec ")), case.id  # a thread, or the command that printed it
        assert {case.verdict, *case.also} <= known, case.id
