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
"""

from __future__ import annotations

import hashlib
import io
import json
import re
from dataclasses import asdict, dataclass

from lmspec.compiler.build.files import MEMORY_CHART
from lmspec.compiler.models.train_memory import TERMS
from lmspec.compiler.models.units import GIB
from lmspec.compiler.plan import Plan

COLORS = {
    "weights": "#4c72b0",
    "gradients": "#55a868",
    "optimizer": "#c44e52",
    "activations": "#8172b2",
    "buffers": "#937860",
}
HASH_SALT = "lmspec"
FIGURE_INCHES = (7.0, 3.6)
_KEY_IN_SVG = re.compile(r"<dc:identifier>lmspec-chart-([0-9a-f]{64})</dc:identifier>")


@dataclass(frozen=True)
class ChartData:
    """Everything the chart draws; its hash decides whether an earlier chart can be kept."""

    title: str
    stage_labels: list[str]
    gib_by_term: dict[str, list[float]]
    budget_gib: float
    lmspec_version: str

    @classmethod
    def of(cls, plan: Plan) -> ChartData:
        stages = plan.trained().memory.stages
        return cls(
            title=f"{plan.name}: training memory per GPU ({plan.spec.hardware.gpu.name})",
            stage_labels=[str(s.stage) for s in stages] if len(stages) > 1 else ["every GPU"],
            gib_by_term={term: [s.terms()[term] / GIB for s in stages] for term in TERMS},
            budget_gib=plan.trained().memory.budget_bytes / GIB,
            lmspec_version=plan.lmspec_version,
        )

    def key(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode("utf-8")).hexdigest()


def memory_chart_svg(data: ChartData) -> str:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.backends.backend_svg import FigureCanvasSVG
    from matplotlib.figure import Figure

    labels, single = data.stage_labels, len(data.stage_labels) == 1
    with matplotlib.rc_context({"svg.hashsalt": HASH_SALT, "svg.fonttype": "none", "font.size": 8}):
        figure = Figure(figsize=FIGURE_INCHES)
        FigureCanvasSVG(figure)
        ax = figure.add_subplot()
        bottom = [0.0] * len(labels)
        for term in TERMS:
            values = data.gib_by_term[term]
            ax.bar(labels, values, bottom=bottom, color=COLORS[term], label=term, width=0.7)
            bottom = [b + v for b, v in zip(bottom, values)]
        budget = data.budget_gib
        ax.axhline(budget, color="black", linestyle="--", linewidth=1)
        ax.text(1.4 if single else len(labels) - 0.5, budget, f"usable {budget:.1f} GiB", ha="right", va="bottom")
        ax.set_ylabel("GiB per GPU")
        ax.set_xlabel("" if single else "pipeline stage")
        ax.set_title(data.title)
        ax.legend(loc="upper left", ncols=len(TERMS), frameon=False, bbox_to_anchor=(0, -0.05 if single else -0.12))
        ax.set_ylim(0, max(max(bottom), budget) * 1.12)
        if single:
            ax.set_xlim(-1.5, 1.5)
        figure.tight_layout()
        out = io.StringIO()
        figure.savefig(
            out, format="svg", metadata={"Date": None, "Creator": "lmspec", "Identifier": f"lmspec-chart-{data.key()}"}
        )
    return out.getvalue()


def chart_key(plan: Plan) -> str:
    """What the chart of `plan` would carry as its identifier: equal keys draw equal charts."""
    return ChartData.of(plan).key()


def drawn_key(svg: str) -> str | None:
    """The key a chart was drawn with, None for an SVG this module did not draw."""
    found = _KEY_IN_SVG.search(svg)
    return found.group(1) if found else None


def emit_memory_chart(plan: Plan) -> dict[str, str]:
    return {MEMORY_CHART: memory_chart_svg(ChartData.of(plan))}
