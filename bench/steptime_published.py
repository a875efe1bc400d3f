"""lmspec's step-time model against published training runs (no GPU needed).

    .venv/bin/python bench/steptime_published.py [--only ID ...] [--data FILE] [--fit]

For each point of tests/data/steptime/published_runs.yaml (issue 21's calibration set), composes the job
through lmspec's own API (`derive_despite_rules`: a spec that breaks a rule is still priced when its
numbers are derivable), takes the step time of the spec's own layout (`steptime.step_time`, the estimate
`lmspec plan` ranks by and `lmspec explain` prints), turns it into tokens/s per GPU and prints it beside the
published figure: the ratio predicted/published per point, the median absolute error overall, per GPU
generation and per precision, the worst points, and the leave-one-source-out median: for each source, the
calibration (`steptime_calibration.Calibration`) is fitted on the other sources' points alone and the left-out source is
priced with it, so that figure measures prediction, not fitting. `--fit` fits the calibration on every point
and writes it, with the fit's provenance, to compiler/models/steptime_calibration.json (what
`steptime_calibration.CALIBRATION` loads). The fit goes by generation (SHARED_BY): the Ampere and Hopper points
fit every constant they move, each later generation's points only its own (blackwell_gemm, cdna_attention).
Points lmspec cannot price are listed with the reason.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import statistics
import sys
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from scipy.optimize import least_squares

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from lmspec.compiler.models import steptime_calibration  # noqa: E402
from lmspec.compiler.models.steptime import step_time  # noqa: E402
from lmspec.compiler.models.steptime_calibration import CALIBRATION, CALIBRATION_FILE, Calibration  # noqa: E402
from lmspec.compiler.models.steptime_inputs import StepConstants, StepInputs, step_constants, step_inputs  # noqa: E402
from lmspec.compiler.pipeline import derive_despite_rules  # noqa: E402

DATA = ROOT / "tests" / "data" / "steptime" / "published_runs.yaml"
CALIBRATION_PATH = Path(steptime_calibration.__file__).with_name(CALIBRATION_FILE)
WORST = 5
# The label each hardware.gpu.generation is scored under: the generations whose constants differ
# (steptime_calibration.CALIBRATED_GENERATION), CDNA 3 and 4 together as they share theirs.
GENERATION = {
    "ampere": "Ampere",
    "ada": "Ampere",
    "hopper": "Hopper",
    "blackwell": "Blackwell",
    "cdna3": "CDNA",
    "cdna4": "CDNA",
}
# The generations whose points fit every constant they move, the shared ones (fp8_gemm, elementwise, the MoE host
# launch, TP overlap) included; each later generation's points then fit only the constants named for it, holding
# the shared ones. A newer generation's few sources run what lmspec does not key (CUDA graphs over the MoE
# router and token preprocessing in Megatron-Bridge's Blackwell recipes), and a joint fit lets them move the
# constants the older generations' 46 points pin: it priced Megatron-Bridge's H100 Qwen3-30B-A3B at twice its
# published throughput.
SHARED_BY = ("Ampere", "Hopper")
# Where each constant may land when fitted: shares of a peak that kernels are known to reach (cuBLAS sustains
# ~0.9 of an A100's bf16 peak and ~0.8 of a Hopper's on large GEMMs (790 of 989 TFLOP/s measured on an H200),
# flash attention 0.35-0.75 forward and backward), so a fit cannot trade one term for another beyond what the
# hardware does.
BOUNDS = {
    "ampere_gemm": (0.5, 0.92),
    "hopper_gemm": (0.5, 0.85),
    # Blackwell's dense peaks, like Hopper's, are the boost clock's: large bf16 GEMMs run below them at the
    # clocks a training step sustains, so the same plateau range as Hopper's.
    "blackwell_gemm": (0.5, 0.85),
    # hipBLASLt reaches less of CDNA's peak than cuBLAS of NVIDIA's: 1159 of MI300X's 2615 FP8 TFLOP/s (0.44)
    # on an 8192^3 GEMM (Azure ND MI300X v5 GEMM benchmark, AI-benchmarking-guide); bf16 is no better.
    "cdna_gemm": (0.35, 0.85),
    "ampere_attention": (0.35, 0.9),
    "hopper_attention": (0.35, 0.9),
    "blackwell_attention": (0.35, 0.9),
    # Flash attention on CDNA: 328.6 of MI300X's 1307 bf16 TFLOP/s (0.25) forward at head dim 64, sequence 8192
    # (the same Azure benchmark, FlashAttention 2.0); Composable Kernel's v3 kernels reach more.
    "cdna_attention": (0.25, 0.9),
    "fp8_gemm": (0.4, 0.85),
    "elementwise": (0.3, 1.0),
    "tp_overlap_exposed": (0.0, 1.0),
    "moe_expert_host_s": (0.0, 0.01),
}


@dataclass(frozen=True)
class Point:
    """One published run as lmspec composes it: the step-time model's inputs, or why there are none."""

    point: Mapping[str, Any]
    rule_errors: int  # errors the spec draws (priced despite them)
    inputs: StepInputs | None = None
    constants: StepConstants | None = None
    tokens_per_gpu_step: float = 0.0
    reason: str = ""  # why inputs is None

    @property
    def published(self) -> float:
        return float(self.point["tokens_per_s_per_gpu"])

    @property
    def source(self) -> str:
        return str(self.point["source"]["name"])

    @property
    def generation(self) -> str:
        return GENERATION[_generation(str(self.point["hardware"]))]

    @property
    def moe(self) -> bool:
        """A mixture-of-experts model (the issue-39 targets are scored apart from the dense points)."""
        return self.constants is not None and self.constants.top_k > 0

    @property
    def precision(self) -> str:
        return str(self.point["layout"].get("train.precision", "bf16"))

    def predicted(self, calibration: Calibration) -> float:
        assert self.inputs is not None and self.constants is not None
        return self.tokens_per_gpu_step / float(step_time(self.inputs, self.constants, calibration).total)

    def ratio(self, calibration: Calibration) -> float:
        return self.predicted(calibration) / self.published


@functools.cache
def _preset(name: str) -> dict[str, Any]:
    """The hardware preset `name` as its YAML file holds it."""
    return dict(yaml.safe_load((ROOT / "specs" / "hardware" / f"{name}.yaml").read_text(encoding="utf-8")))


def _generation(hardware: str) -> str:
    return str(_preset(hardware)["gpu"]["generation"])


def _value(v: Any) -> str:
    return ("true" if v else "false") if isinstance(v, bool) else str(v)


def overrides(point: Mapping[str, Any]) -> list[str]:
    """The point as `lmspec` command-line overrides: model, hardware and node count, then the layout."""
    per_node = int(_preset(point["hardware"])["gpus_per_node"])
    if point["gpus"] % per_node:
        raise ValueError(f"{point['id']}: gpus={point['gpus']} is not a multiple of {per_node} GPUs per node")
    model = point["model"]
    preset, model_keys = (model, {}) if isinstance(model, str) else (model["preset"], model.get("keys", {}))
    nodes = point["gpus"] // per_node
    keys = {**model_keys, **point.get("hardware_keys", {}), **point["layout"]}
    return [
        f"model={preset}",
        f"hardware={point['hardware']}",
        f"hardware.nodes={nodes}",
        *(["cluster=slurm"] if nodes > 1 else []),
        "serve=null",  # a training job: the serving rules have nothing to say about these runs
        f"name={point['id'].replace('.', '_')}",
        *(f"{k}={_value(v)}" for k, v in keys.items()),
    ]


def compose(point: Mapping[str, Any]) -> Point:
    derived = derive_despite_rules(overrides(point))
    errors = [p for p in derived.problems if p.severity == "error"]
    if derived.plan is None or derived.plan.train is None:
        reason = "; ".join(f"{p.key}: {p.message}" for p in errors) or "no training plan"
        return Point(point, len(errors), reason=reason.splitlines()[0][:160])
    train = derived.plan.train
    inputs = step_inputs(train.spec, train.memory)
    if inputs is None:
        return Point(point, len(errors), reason="the layout does not divide")
    per_gpu_step = train.batch.tokens_per_step / train.layout.world_size
    return Point(point, len(errors), inputs, step_constants(train.spec), per_gpu_step)


def median_error(rows: Sequence[Point], calibration: Calibration) -> float | None:
    return statistics.median(abs(r.ratio(calibration) - 1) for r in rows) if rows else None


def _residuals(points: Sequence[Point], values: Mapping[str, float]) -> np.ndarray:
    return np.array([math.log(p.ratio(Calibration(**values))) for p in points])


def exercised(points: Sequence[Point], start: Calibration = CALIBRATION) -> list[str]:
    """The constants `points` can fit: those whose residuals move with them (not Ampere's flash attention
    when every Ampere point predates it)."""
    start_values = dataclasses.asdict(start)
    base = _residuals(points, start_values)
    return [
        n
        for n in Calibration.names()
        if not np.allclose(_residuals(points, {**start_values, n: start_values[n] * 1.01}), base, rtol=0, atol=1e-12)
    ]


def _solve(points: Sequence[Point], start: Calibration, names: Collection[str]) -> Calibration:
    """The calibration minimising the squared log ratios over `points` by the constants of `names` they move,
    searched from the middle of each constant's BOUNDS (so the result is a function of the points alone), the
    others held at `start`."""
    start_values = {n: float(getattr(start, n)) for n in Calibration.names()}
    free = [n for n in exercised(points, start) if n in names]
    if not free:
        return start
    low, high = (np.array(b) for b in zip(*(BOUNDS[n] for n in free)))
    solved = least_squares(
        lambda x: _residuals(points, {**start_values, **dict(zip(free, x))}),
        (low + high) / 2,
        bounds=(low, high),
        x_scale="jac",
    )
    at_bound = np.isclose(solved.x, low, rtol=0, atol=1e-9)  # the solver stops a hair off a bound
    values = np.where(at_bound, low, solved.x)
    return Calibration(**{**start_values, **{n: float(f"{v:.3g}") for n, v in zip(free, values)}})


def _stages(points: Sequence[Point]) -> list[tuple[list[Point], tuple[str, ...]]]:
    """The fit's stages: the SHARED_BY generations' points and every constant, then each later generation's
    points and the constants named for it (`blackwell_gemm` for Blackwell)."""
    later = [g for g in dict.fromkeys(GENERATION.values()) if g not in SHARED_BY]
    return [
        ([p for p in points if p.generation in SHARED_BY], Calibration.names()),
        *(
            (
                [p for p in points if p.generation == g],
                tuple(n for n in Calibration.names() if n.startswith(f"{g.lower()}_")),
            )
            for g in later
        ),
    ]


def fit(points: Sequence[Point], start: Calibration = CALIBRATION) -> Calibration:
    """The calibration fitted on `points` stage by stage (`_stages`): refitting its own output changes nothing,
    and each left-out source's fit starts where every other does. A constant no point exercises keeps its
    value in `start` rather than drifting to a bound."""
    calibration = start
    for rows, names in _stages(points):
        if rows:
            calibration = _solve(rows, calibration, names)
    return calibration


def fitted_names(points: Sequence[Point], start: Calibration = CALIBRATION) -> list[str]:
    """The constants `fit` moves: those each stage's points exercise among the stage's names."""
    moved = {n for rows, names in _stages(points) if rows for n in exercised(rows, start) if n in names}
    return [n for n in Calibration.names() if n in moved]


def leave_one_source_out(points: Sequence[Point]) -> dict[str, float]:
    """Each point's absolute error when its source is left out of the fit, by point id."""
    errors: dict[str, float] = {}
    for source in sorted({p.source for p in points}):
        held_out = [p for p in points if p.source == source]
        calibration = fit([p for p in points if p.source != source])
        errors.update({str(p.point["id"]): abs(p.ratio(calibration) - 1) for p in held_out})
    return errors


def _median_held(rows: Sequence[Point], loso: Mapping[str, float]) -> float | None:
    held = [loso[str(p.point["id"])] for p in rows if str(p.point["id"]) in loso]
    return statistics.median(held) if held else None


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def _median_ratio(rows: Sequence[Point], calibration: Calibration) -> str:
    return f"{statistics.median(r.ratio(calibration) for r in rows):.3f}" if rows else "n/a"


PRECISIONS = ("bf16", "fp8", "fp4")


def _groups(points: Sequence[Point]) -> list[tuple[str, list[Point]]]:
    """The subsets scored apart: dense and MoE, each GPU generation (in GENERATION's order), each precision."""
    generations = dict.fromkeys(GENERATION.values())
    return [
        ("dense", [p for p in points if not p.moe]),
        ("MoE", [p for p in points if p.moe]),
        *((g, [p for p in points if p.generation == g]) for g in generations),
        *((q, [p for p in points if p.precision == q]) for q in PRECISIONS),
    ]


def report(points: Sequence[Point], calibration: Calibration, loso: Mapping[str, float]) -> None:
    ok = [r for r in points if r.inputs is not None]
    print(
        f"{'point':40} {'source':26} {'gpu':9} {'prec':4} {'published':>10} {'predicted':>10} {'ratio':>6} {'loso':>6}"
    )
    for r in points:
        head = f"{r.point['id']:40} {r.source:26} {r.generation:9} {r.precision:4} {r.published:10.1f}"
        if r.inputs is None:
            print(f"{head} {'-':>10} {'-':>6}  not priced: {r.reason}")
            continue
        notes = f"  priced despite {r.rule_errors} rule errors" if r.rule_errors else ""
        held = loso.get(str(r.point["id"]))
        print(
            f"{head} {r.predicted(calibration):10.1f} {r.ratio(calibration):6.3f} "
            f"{'' if held is None else _pct(held):>6}{notes}"
        )
    print()
    print(f"priced {len(ok)} of {len(points)} points; tokens/s per GPU, ratio = predicted / published")
    overall = _pct(median_error(ok, calibration))
    print(f"median absolute error: {overall} overall (median ratio {_median_ratio(ok, calibration)})")
    for label, rows in _groups(ok):
        error, ratio = _pct(median_error(rows, calibration)), _median_ratio(rows, calibration)
        print(f"  {label:28} {error:>6}  over {len(rows)} points (median ratio {ratio})")
    print(f"worst {WORST}:")
    for r in sorted(ok, key=lambda r: abs(r.ratio(calibration) - 1), reverse=True)[:WORST]:
        print(f"  {r.point['id']:40} ratio {r.ratio(calibration):.3f}  ({r.source})")
    if loso:
        every = list(loso.values())
        print(
            f"leave-one-source-out median absolute error: {_pct(statistics.median(every))} "
            f"(worst {_pct(max(every))}; each source priced with the calibration fitted on the others)"
        )
        for label, rows in _groups(ok):
            errors = [loso[str(r.point["id"])] for r in rows if str(r.point["id"]) in loso]
            if errors and label not in PRECISIONS:
                print(
                    f"  {label:28} {_pct(statistics.median(errors)):>6}  over {len(errors)} points "
                    f"(worst {_pct(max(errors))})"
                )


def _from_root(path: Path) -> str:
    """`path` relative to the checkout (the same wherever the bench runs from), else as given."""
    resolved = path.resolve()
    return resolved.relative_to(ROOT).as_posix() if resolved.is_relative_to(ROOT) else str(path)


def calibration_document(
    calibration: Calibration, points: Sequence[Point], data: Path, loso: Mapping[str, float]
) -> dict[str, Any]:
    """steptime_calibration.json: the constants, how they were fitted and how well they predict, and the
    notes on the constants no point moves (kept from the file as it stands). What the fit moves is judged from
    the calibration it started from (a constant fitted to a bound of zero moves nothing any more)."""
    fitted = fitted_names(points)
    held = list(loso.values())
    notes = json.loads(CALIBRATION_PATH.read_text(encoding="utf-8")).get("notes", {})
    return {
        "constants": dataclasses.asdict(calibration),
        "fit": {
            "command": ".venv/bin/python bench/steptime_published.py --fit",
            "data": _from_root(data),
            "points": len(points),
            "sources": len({p.source for p in points}),
            "method": (
                "least squares on log(predicted / published) tokens/s per GPU, each constant within "
                "bench/steptime_published.py's BOUNDS, rounded to 3 significant digits: first every constant on the "
                f"{' and '.join(SHARED_BY)} points, then each later generation's own constants on its points"
            ),
            "fitted": fitted,
            "kept": [n for n in Calibration.names() if n not in fitted],
            "median_absolute_error": _pct(median_error(points, calibration)),
            "leave_one_source_out_median_absolute_error": _pct(statistics.median(held)),
            "leave_one_source_out_worst": _pct(max(held)),
            **{
                f"{label.lower()}_{name}": value
                for label, rows in _groups(points)
                if label not in PRECISIONS
                for name, value in (
                    ("points", len(rows)),
                    ("median_absolute_error", _pct(median_error(rows, calibration))),
                    ("leave_one_source_out_median_absolute_error", _pct(_median_held(rows, loso))),
                    ("leave_one_source_out_worst", _pct(max((loso[str(p.point["id"])] for p in rows), default=None))),
                )
            },
        },
        "notes": notes,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--only", nargs="+", metavar="ID", help="score these points only (no refits)")
    parser.add_argument(
        "--fit", action="store_true", help=f"fit the calibration on every point and write it to {CALIBRATION_FILE}"
    )
    args = parser.parse_args(argv)
    raw = yaml.safe_load(args.data.read_text(encoding="utf-8"))["points"]
    if args.only:
        unknown = sorted(set(args.only) - {p["id"] for p in raw})
        if unknown:
            parser.error(f"no point {', '.join(unknown)} in {args.data}")
        raw = [p for p in raw if p["id"] in args.only]
    points = [compose(p) for p in raw]
    priced = [p for p in points if p.inputs is not None]
    calibration = CALIBRATION
    if args.fit:
        calibration = fit(priced)
        print("fitted on every point:", ", ".join(f"{k}={v}" for k, v in dataclasses.asdict(calibration).items()))
    loso = {} if args.only else leave_one_source_out(priced)
    if args.fit and args.only:
        print(f"not written to {CALIBRATION_FILE}: --only fits a subset")
    elif args.fit:
        document = calibration_document(calibration, priced, args.data, loso)
        CALIBRATION_PATH.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {CALIBRATION_PATH.relative_to(ROOT)}")
    report(points, calibration, loso)
    return 0 if priced else 1


if __name__ == "__main__":
    sys.exit(main())
