"""Does `lmspec plan` rank published layouts where they belong? (issue 21, item 4; no GPU needed)

    .venv/bin/python bench/steptime_ranking.py [--only ID ...]
    .venv/bin/python bench/steptime_ranking.py --standing deepseek_v3_2048gpu_h800

`--standing ID` prints where one point's published layout stands among plan's candidates for the same job:
its rank by tokens/s among every layout that fits and among those without lmspec's communication warning
(plan's winner is the best of the latter), its estimate as a share of the winner's, and the two steps'
terms side by side (compute, exposed TP/EP/CP/PP/DP communication, bubble, optimizer).

For each point of tests/data/steptime/published_runs.yaml, runs `lmspec plan`'s search over the same job
(model, hardware, GPU count, global batch, sequence, precision, and the run's backend: a team on one framework
compares layouts within it; Megatron with Transformer Engine, parallel.overlap.tp_comm off: no lmspec target
runs it) and prints the published layout's predicted
tokens/s per GPU as a share of the winner's, with the winner's layout. Then, for every source that ran several
layouts of one job, whether lmspec orders them as published. The published layout is priced as the calibration
set writes it (its own overlap settings and virtual stages; plan's candidates search the virtual stages,
with no TP overlap).

A share below the floor has two possible causes, and the second column tells them apart: the best candidate
of plan's own search that keeps the published TP, PP, CP and EP (plan choosing only the micro-batch,
recompute, interleaving, sequence parallel and sharding) as a share of the winner. Where that reaches the floor, the
published parallel layout is as good as plan's and the gap is in per-rank settings the run did not use
(often did not have yet: the 2021 runs predate selective recompute and the distributed optimizer); where it
does not, plan prefers another parallel layout.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from steptime_published import DATA, Point, compose, overrides  # noqa: E402

from lmspec.compiler.models.steptime import step_time  # noqa: E402
from lmspec.compiler.models.steptime_calibration import CALIBRATION  # noqa: E402
from lmspec.compiler.models.summary import comm_over_warning  # noqa: E402
from lmspec.compiler.pipeline import derive_despite_rules  # noqa: E402
from lmspec.compiler.search.report import TERM_NAMES, Row, row_at, rows  # noqa: E402
from lmspec.compiler.search.search import SearchResult, search  # noqa: E402
from lmspec.compiler.spec.sections import TrainingSpec  # noqa: E402

FLOOR = 0.85  # the bar: a published layout predicts at >= 85% of plan's winner
# What makes two points one job whose layouts a source compares: the precision recipe is the job's, not the
# layout's (plan keeps the spec's recipe), so runs that differ in it compare recipes, which the orderings leave out
JOB_KEYS = ("train.seq_length", "train.global_batch_size", "train.precision", "train.fp8_recipe", "train.fp4_recipe")


@dataclass(frozen=True)
class Ranked:
    point: Point
    winner_tokens_per_s_per_gpu: float | None
    winner: str  # its layout, as plan's table shows it
    same_dims_share: float | None = None  # plan's best at the published TP/PP/CP/EP, as a share of the winner
    same_dims: str = ""  # that candidate's per-rank settings, or why there is none
    saved: tuple[tuple[str, float], ...] = ()  # the terms of the published step the winner shortens most (s)

    @property
    def share(self) -> float | None:
        if self.winner_tokens_per_s_per_gpu is None:
            return None
        return self.point.predicted(CALIBRATION) / self.winner_tokens_per_s_per_gpu


def described(row: Row) -> str:
    v = row.values
    layout = f"{row.layout_text()} {row.sharding_text()} mbs {v['train.micro_batch_size']}"
    return f"{layout} recompute {v['train.recompute']}"


def saved_terms(point: Point, winner: Row) -> tuple[tuple[str, float], ...]:
    """The two terms of the published layout's step that the winner's step shortens most, with the seconds."""
    assert point.inputs is not None and point.constants is not None
    published = step_time(point.inputs, point.constants, CALIBRATION)
    saved = {name: float(getattr(published, name)) - winner.terms_s[name] for name in TERM_NAMES}
    return tuple((name, saved[name]) for name in sorted(saved, key=lambda k: -saved[k])[:2] if saved[name] > 0)


def best_at_dims(result: SearchResult, spec: TrainingSpec) -> Row | None:
    """The fastest candidate that fits with the spec's own TP, PP, CP and EP, or None."""
    p, f = spec.parallel, result.priced.feasible
    same = (f.tp == p.tp) & (f.pp == p.pp) & (f.cp == p.cp) & (f.ep == p.ep)
    hits = np.flatnonzero(same)
    if not hits.size:
        return None
    i = int(hits[np.argmax(result.priced.tokens_per_s[hits])])
    return row_at(result, i)


def rank(point: Point) -> Ranked:
    # plan's Megatron candidates run Transformer Engine (FP8, flash attention) whatever the published stack was
    words = [*overrides(point.point), "parallel.overlap.tp_comm=false", "train.transformer_impl=transformer_engine"]
    plan = derive_despite_rules(words).plan
    assert plan is not None and plan.train is not None
    spec = plan.train.spec
    result = search(spec, [spec.hardware.nodes], (spec.train.backend,), "throughput", 1)
    if not result.legal:
        return Ranked(point, None, f"lmspec's {spec.train.backend} target runs no layout of this job")
    if not result.feasible:
        return Ranked(point, None, "no layout fits")
    best = rows(result, 1)[0]
    world = spec.hardware.nodes * spec.hardware.gpus_per_node
    own = best_at_dims(result, spec)
    saved = saved_terms(point, best)
    if own is None:
        why = "no candidate keeps them (uneven stages, or none fits lmspec's memory budget)"
        return Ranked(point, best.tokens_per_s / world, described(best), same_dims=why, saved=saved)
    share = own.tokens_per_s / best.tokens_per_s
    return Ranked(point, best.tokens_per_s / world, described(best), share, described(own), saved)


@dataclass(frozen=True)
class Standing:
    """A published layout among plan's candidates for its job (`standing`)."""

    point: Point
    winner: Row
    published_terms: dict[str, float]  # TERM_NAMES -> seconds per step of the published layout
    published_flagged: bool  # the communication warning fires on it
    rank_all: int  # 1 + the layouts that fit and are priced faster
    rank_unflagged: int  # 1 + the layouts without the communication warning that are priced faster
    feasible: int
    warned: int
    fastest_flagged: Row | None  # the fastest layout the warning flags, where it is priced faster than the winner

    @property
    def share(self) -> float:
        """The published layout's estimated tokens/s as a share of plan's winner's."""
        return self.winner.step_time_s / sum(self.published_terms.values())


def standing(point: Point) -> Standing:
    words = [*overrides(point.point), "parallel.overlap.tp_comm=false", "train.transformer_impl=transformer_engine"]
    plan = derive_despite_rules(words).plan
    assert plan is not None and plan.train is not None and point.inputs is not None and point.constants is not None
    spec = plan.train.spec
    result = search(spec, [spec.hardware.nodes], (spec.train.backend,), "throughput", 1)
    published = step_time(point.inputs, point.constants, CALIBRATION)
    total = float(published.total)
    step = result.priced.step_time_s
    flagged = np.flatnonzero(result.flagged)
    fastest = int(flagged[np.argmin(step[flagged])]) if flagged.size else None
    winner = rows(result, 1)[0]
    faster_flagged = fastest is not None and step[fastest] < winner.step_time_s
    return Standing(
        point=point,
        winner=winner,
        published_terms={name: float(getattr(published, name)) for name in TERM_NAMES},
        published_flagged=bool(comm_over_warning(published)),
        rank_all=1 + int(np.count_nonzero(step < total)),
        rank_unflagged=1 + int(np.count_nonzero((step < total) & ~result.flagged)),
        feasible=result.feasible,
        warned=result.warned,
        fastest_flagged=row_at(result, fastest) if faster_flagged and fastest is not None else None,
    )


def print_standing(s: Standing) -> None:
    w, f = s.winner, s.fastest_flagged
    print(
        f"{s.point.point['id']}: plan's winner {described(w)} "
        f"({w.step_time_s:.4g} s/step, {w.memory_bytes / 2**30:.1f} GiB/GPU)"
    )
    if f is not None:
        print(f"fastest layout the communication warning flags (ranked below the winner): {described(f)}")
    print(
        f"published layout: rank #{s.rank_all:,} of {s.feasible:,} layouts that fit by estimated step time, "
        f"#{s.rank_unflagged:,} among the {s.feasible - s.warned:,} without the communication warning; "
        f"its estimate is {s.share:.3f} of the winner's tokens/s"
        f"{'; it draws the communication warning' if s.published_flagged else ''}"
    )
    columns = [("published", s.published_terms), ("winner", w.terms_s)] + ([("flagged", f.terms_s)] if f else [])
    print(f"{'term (s per step)':28}" + "".join(f"{name:>12}" for name, _ in columns))
    for term in TERM_NAMES:
        print(f"{TERM_NAMES[term]:28}" + "".join(f"{terms[term]:12.4g}" for _, terms in columns))
    print(f"{'step':28}" + "".join(f"{sum(terms.values()):12.4g}" for _, terms in columns))
    comm = ("tp_comm", "ep_comm", "cp_comm", "pp_comm", "dp_comm")
    ratios = [sum(terms[k] for k in comm) / terms["compute"] for _, terms in columns]
    print(f"{'exposed comm / compute':28}" + "".join(f"{r:12.1%}" for r in ratios))


def job(point: Point) -> tuple:
    p = point.point
    return (point.source, str(p["model"]), p["hardware"], p["gpus"], *(p["layout"].get(k) for k in JOB_KEYS))


def orderings(points: Sequence[Point]) -> list[tuple[Point, Point, bool]]:
    """Each pair of one source's layouts of one job, the faster published first, and whether lmspec agrees."""
    out = []
    for a, b in combinations(points, 2):
        if job(a) == job(b):
            fast, slow = (a, b) if a.published >= b.published else (b, a)
            out.append((fast, slow, fast.predicted(CALIBRATION) > slow.predicted(CALIBRATION)))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", metavar="ID", help="rank these points only")
    parser.add_argument("--standing", metavar="ID", help="one point's rank among plan's candidates, with terms")
    args = parser.parse_args(argv)
    raw = yaml.safe_load(DATA.read_text(encoding="utf-8"))["points"]
    if args.standing:
        print_standing(standing(next(compose(p) for p in raw if p["id"] == args.standing)))
        return 0
    points = [compose(p) for p in raw if not args.only or p["id"] in args.only]
    print(f"{'point':42} {'published / winner':>18} {'its dims / winner':>17}  plan's winner")
    ranked = [rank(p) for p in points]
    for r in ranked:
        share = "no winner" if r.share is None else f"{r.share:.3f}"
        own = "-" if r.same_dims_share is None else f"{r.same_dims_share:.3f}"
        print(f"{r.point.point['id']:42} {share:>18} {own:>17}  {r.winner}")
    shares = [r.share for r in ranked if r.share is not None]
    below = [r for r in ranked if r.share is not None and r.share < FLOOR]
    print(f"\nlowest share {min(shares):.3f}; below {FLOOR}: {', '.join(r.point.point['id'] for r in below) or 'none'}")
    for r in below:
        own = "none" if r.same_dims_share is None else f"{r.same_dims_share:.3f}"
        where = "per-rank settings" if r.same_dims_share and r.same_dims_share >= FLOOR else "parallel layout"
        print(f"  {r.point.point['id']}: the gap is in the {where}; plan's best at its dims ({own}): {r.same_dims}")
        saved = ", ".join(f"{seconds:.3g} s of {TERM_NAMES[name]}" for name, seconds in r.saved)
        assert r.share is not None  # `below` holds ranked points only
        print(f"    the winner's step is {1 - r.share:.0%} shorter: it saves {saved}")
    pairs = orderings(points)
    for fast, slow, agrees in pairs:
        print(
            f"{fast.source}: {fast.point['id']} ({fast.published:g}) > {slow.point['id']} ({slow.published:g}): "
            f"lmspec {'agrees' if agrees else 'DISAGREES'} ({fast.predicted(CALIBRATION):.1f} vs "
            f"{slow.predicted(CALIBRATION):.1f})"
        )
    return 0 if not below and all(agrees for *_, agrees in pairs) else 1


if __name__ == "__main__":
    sys.exit(main())
