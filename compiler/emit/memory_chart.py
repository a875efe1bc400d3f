"""report/memory.svg: per-GPU training memory of every pipeline stage as stacked bars.

matplotlib is imported inside the emitter (compiling a spec imports nothing heavy before it
is needed) and driven for byte-identical output: the Agg-free SVG canvas, a fixed hash
salt for element ids, no date in the metadata, text kept as text.
"""

from __future__ import annotations

import io

from compiler.models.train_memory import GIB, TERMS
from compiler.plan import Plan

CHART_PATH = "report/memory.svg"
COLORS = {"weights": "#4c72b0", "gradients": "#55a868", "optimizer": "#c44e52", "activations": "#8172b2",
          "buffers": "#937860"}
HASH_SALT = "lmspec"
FIGURE_INCHES = (7.0, 3.6)


def memory_chart_svg(plan: Plan) -> str:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.backends.backend_svg import FigureCanvasSVG
    from matplotlib.figure import Figure

    stages = plan.memory.stages
    labels = [str(s.stage) for s in stages] if len(stages) > 1 else ["every GPU"]
    with matplotlib.rc_context({"svg.hashsalt": HASH_SALT, "svg.fonttype": "none", "font.size": 8}):
        figure = Figure(figsize=FIGURE_INCHES)
        FigureCanvasSVG(figure)
        ax = figure.add_subplot()
        bottom = [0.0] * len(stages)
        for term in TERMS:
            values = [s.terms()[term] / GIB for s in stages]
            ax.bar(labels, values, bottom=bottom, color=COLORS[term], label=term, width=0.7)
            bottom = [b + v for b, v in zip(bottom, values)]
        budget = plan.memory.budget_bytes / GIB
        ax.axhline(budget, color="black", linestyle="--", linewidth=1)
        ax.text(len(stages) - 0.5 if len(stages) > 1 else 1.4, budget, f"usable {budget:.1f} GiB", ha="right", va="bottom")
        ax.set_ylabel("GiB per GPU")
        ax.set_xlabel("pipeline stage" if len(stages) > 1 else "")
        ax.set_title(f"{plan.name}: training memory per GPU ({plan.spec.hardware.gpu.name})")
        ax.legend(loc="upper left", ncols=len(TERMS), frameon=False, bbox_to_anchor=(0, -0.12 if len(stages) > 1 else -0.05))
        ax.set_ylim(0, max(max(bottom), budget) * 1.12)
        if len(stages) == 1:
            ax.set_xlim(-1.5, 1.5)
        figure.tight_layout()
        out = io.StringIO()
        figure.savefig(out, format="svg", metadata={"Date": None, "Creator": "lmspec"})
    return out.getvalue()


def emit_memory_chart(plan: Plan) -> dict[str, str]:
    return {CHART_PATH: memory_chart_svg(plan)}
