"""report/memory.svg: per-GPU training memory of every pipeline stage as stacked bars.

matplotlib is imported inside the emitter (compiling a spec imports nothing heavy before it
is needed) and driven for byte-identical output: the Agg-free SVG canvas, a fixed hash
salt for element ids, no date in the metadata, text kept as text.

Importing matplotlib costs ~0.4 s, more than the rest of a compile, so the chart is keyed
by the numbers it draws: `chart_key(plan)` goes into the SVG's Dublin Core identifier, where
`drawn_key(svg)` finds it again. The writer (compiler/build/writer.py) keeps the earlier
build's untouched chart when the keys match, as make keeps a target whose inputs did not
change; a spec edit that moves no memory figure (lr, steps, serving, NCCL) then compiles
without matplotlib. This module reads nothing: the chart is a function of the Plan.

What a reviewer reads off it: each bar's total printed on it (two decimals, as REPORT.md's memory
table), the worst stage outlined and labelled, the y axis fitted to the bars, the usable limit as a
dashed line when it is near them and as an off-scale note at the top when it is far above (a line at
79 GiB over bars of 20 would squash them), in Okabe-Ito colours, safe for colour-blind readers.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
from dataclasses import asdict, dataclass

from lmspec.compiler.build.files import MEMORY_CHART
from lmspec.compiler.emit.report_format import memory_unit, two_decimals
from lmspec.compiler.models.train_memory import TERMS
from lmspec.compiler.plan import Plan

# Okabe & Ito's colour-blind-safe palette (https://jfly.uni-koeln.de/color/), no green at all, so no
# red-green pair anywhere; blue and sky blue are kept apart by orange.
COLORS = {
    "weights": "#0072B2",  # blue
    "gradients": "#E69F00",  # orange
    "optimizer": "#56B4E9",  # sky blue
    "activations": "#CC79A7",  # reddish purple
    "workspace": "#F0E442",  # yellow
    "allocator": "#000000",  # black
}
HASH_SALT = "lmspec"
FIGURE_INCHES = (7.0, 3.6)
# Bumped whenever the drawing changes, so a chart drawn by the old code is not kept for equal numbers.
STYLE = "2: totals on bars, worst stage marked, axis fitted to the bars, Okabe-Ito"
# The usable line is drawn when it is at most this many times the tallest bar; above, the axis fits the
# bars and the limit is written as an off-scale note at the top (the bars stay readable).
USABLE_IN_SCALE = 1.6
HEADROOM = 1.22  # axis top over the tallest bar (room for the totals printed above the bars)
_KEY_IN_SVG = re.compile(r"<dc:identifier>lmspec-chart-([0-9a-f]{64})</dc:identifier>")


@dataclass(frozen=True)
class ChartData:
    """Everything the chart draws; its hash decides whether an earlier chart can be kept."""

    title: str
    stage_labels: list[str]
    unit: str  # GiB, or MiB when the worst stage needs less than 1 GiB (report_format.memory_unit)
    by_term: dict[str, list[float]]  # in `unit`
    budget: float  # in `unit`
    worst: int  # index of the worst stage (TrainMemory.worst)
    lmspec_version: str
    style: str = STYLE

    @classmethod
    def of(cls, plan: Plan) -> ChartData:
        memory = plan.trained().memory
        stages = memory.stages
        unit = memory_unit(memory.worst.total_bytes)
        return cls(
            title=f"{plan.name}: training memory per GPU ({plan.spec.hardware.gpu.name})",
            stage_labels=[str(s.stage) for s in stages] if len(stages) > 1 else ["every GPU"],
            unit=unit.binary,
            by_term={term: [s.terms()[term] / unit.binary_bytes for s in stages] for term in TERMS},
            budget=memory.budget_bytes / unit.binary_bytes,
            worst=stages.index(memory.worst),
            lmspec_version=plan.lmspec_version,
        )

    @property
    def totals(self) -> list[float]:
        return [sum(values) for values in zip(*self.by_term.values())]

    def key(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode("utf-8")).hexdigest()


def memory_chart_svg(data: ChartData) -> str:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.backends.backend_svg import FigureCanvasSVG
    from matplotlib.figure import Figure

    labels, single = data.stage_labels, len(data.stage_labels) == 1
    totals = data.totals
    with matplotlib.rc_context({"svg.hashsalt": HASH_SALT, "svg.fonttype": "none", "font.size": 8}):
        figure = Figure(figsize=FIGURE_INCHES)
        FigureCanvasSVG(figure)
        ax = figure.add_subplot()
        x = list(range(len(labels)))
        bottom = [0.0] * len(labels)
        for term in TERMS:
            values = data.by_term[term]
            ax.bar(x, values, bottom=bottom, color=COLORS[term], label=term, width=0.7, edgecolor="white", lw=0.3)
            bottom = [b + v for b, v in zip(bottom, values)]
        tallest = max(totals)
        worst = data.worst
        # the worst stage: a black outline round its bar, its total in bold, "worst" under its label
        if not single:
            ax.bar([worst], [totals[worst]], width=0.7, fill=False, edgecolor="black", linewidth=1.4)
        for i, total in enumerate(totals):
            ax.text(
                i,
                total + tallest * 0.015,
                two_decimals(total),
                ha="center",
                va="bottom",
                fontsize=6.5 if len(labels) > 8 else 8,
                fontweight="bold" if i == worst else "normal",
            )
        top, in_scale = axis_top(data)
        budget = data.budget
        x_right = 1.4 if single else len(labels) - 0.5
        if in_scale:
            ax.axhline(budget, color="black", linestyle="--", linewidth=1)
            ax.text(x_right, budget, f"usable {two_decimals(budget)} {data.unit}", ha="right", va="bottom")
        else:
            ax.text(
                x_right,
                top,
                f"usable {two_decimals(budget)} {data.unit} per GPU: off scale, "
                f"{budget / tallest:.1f}x the worst stage \u2191",
                ha="right",
                va="bottom",
                fontsize=8,
                bbox={"boxstyle": "round,pad=0.25", "facecolor": "white", "edgecolor": "black", "linewidth": 0.6},
            )
        ax.set_ylim(0, top)
        ax.set_xticks(x, [f"{label}\nworst" if i == worst and not single else label for i, label in enumerate(labels)])
        if not single:
            ax.get_xticklabels()[worst].set_fontweight("bold")
        ax.set_ylabel(f"{data.unit} per GPU")
        ax.set_xlabel("" if single else "pipeline stage")
        ax.set_title(data.title, pad=14)
        ax.legend(loc="upper left", ncols=len(TERMS), frameon=False, bbox_to_anchor=(0, -0.07 if single else -0.2))
        ax.spines[["top", "right"]].set_visible(False)
        if single:
            ax.set_xlim(-1.5, 1.5)
        figure.tight_layout()
        out = io.StringIO()
        figure.savefig(
            out, format="svg", metadata={"Date": None, "Creator": "lmspec", "Identifier": f"lmspec-chart-{data.key()}"}
        )
    return out.getvalue()


def axis_top(data: ChartData) -> tuple[float, bool]:
    """The y axis' top, and whether the usable line is drawn on it: fitted to the bars, unless the usable
    limit is near enough (USABLE_IN_SCALE) to show without squashing them."""
    tallest = max(data.totals)
    if data.budget <= tallest * USABLE_IN_SCALE:
        return max(tallest * HEADROOM, data.budget * 1.08), True
    return tallest * HEADROOM, False


def chart_key(plan: Plan) -> str:
    """What the chart of `plan` would carry as its identifier: equal keys draw equal charts."""
    return ChartData.of(plan).key()


def drawn_key(svg: str) -> str | None:
    """The key a chart was drawn with, None for an SVG this module did not draw."""
    found = _KEY_IN_SVG.search(svg)
    return found.group(1) if found else None


def emit_memory_chart(plan: Plan) -> dict[str, str]:
    return {MEMORY_CHART: memory_chart_svg(ChartData.of(plan))}
