"""The doctor scored on the corpus of real log excerpts (tests/data/logs/corpus/README.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import yaml

CORPUS = Path(__file__).resolve().parents[1] / "data" / "logs" / "corpus"
CHECKS = ("verdict", "keys", "exit", "no_traceback")
HEALTHY = "healthy"
LMSPEC = Path(sys.executable).with_name("lmspec")  # the environment's console script


@dataclass(frozen=True)
class Case:
    id: str
    log: Path
    source: str
    kind: str
    verdict: str
    also: tuple[str, ...]
    keys: tuple[str, ...]
    shown: tuple[str, ...]


@dataclass(frozen=True)
class Score:
    case: Case
    passed: dict[str, bool]
    got: list[str]  # the signatures the doctor reported, in order
    detail: str  # what the doctor printed, for a miss

    @property
    def misses(self) -> list[str]:
        return [check for check in CHECKS if not self.passed[check]]


def cases(directory: Path = CORPUS) -> list[Case]:
    """Every case of a corpus directory: the doctor's own by default, or the second (tests/data/logs/corpus2)."""
    found = []
    for meta in sorted(directory.glob("*.yaml")):
        doc = yaml.safe_load(meta.read_text())
        found.append(
            Case(
                id=meta.stem,
                log=meta.with_suffix(".log"),
                source=doc["source"],
                kind=doc["kind"],
                verdict=doc["verdict"],
                also=tuple(doc.get("also") or ()),
                keys=tuple(doc.get("keys") or ()),
                shown=tuple(doc.get("shown") or ()),
            )
        )
    return found


def score(case: Case) -> Score:
    """`lmspec doctor --format json` on the excerpt as its own process (the console script users run):
    a crash is a traceback on stderr."""
    run = subprocess.run(
        [str(LMSPEC), "doctor", str(case.log), "--format", "json"],
        capture_output=True,
        text=True,
        check=False,
    )
    try:
        findings = json.loads(run.stdout)
    except json.JSONDecodeError:
        findings = []
    got = [f["signature"] for f in findings]
    fixes = [fix for f in findings for fix in f["fixes"]]
    shown = "\n".join(
        [
            *(f["cause"] for f in findings),
            *(e["text"] for f in findings for e in f["evidence"]),
            *(f"{fix['key']}={fix['value']}" for fix in fixes),
        ]
    )
    if case.verdict == HEALTHY:
        verdict = got == []
    else:
        verdict = got[:1] == [case.verdict] and set(got[1:]) <= set(case.also)
    passed = {
        "verdict": verdict,
        "keys": all(key in {fix["key"] for fix in fixes} for key in case.keys)
        and all(text in shown for text in case.shown),
        "exit": run.returncode == (0 if case.verdict == HEALTHY else 1),
        "no_traceback": "Traceback" not in run.stderr,
    }
    return Score(case, passed, got, run.stdout + run.stderr)


def table(scores: list[Score]) -> str:
    """One row per kind and a total: cases, then the share passing each check."""
    by_kind: dict[str, list[Score]] = defaultdict(list)
    for s in scores:
        by_kind[s.case.kind].append(s)
    rows = [("kind", "cases", *CHECKS)]
    for kind, group in [*sorted(by_kind.items()), ("all", scores)]:
        rows.append((kind, str(len(group)), *(f"{share(group, check):.0%}" for check in CHECKS)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in rows)


def share(scores: list[Score], check: str) -> float:
    return sum(s.passed[check] for s in scores) / len(scores) if scores else 1.0
