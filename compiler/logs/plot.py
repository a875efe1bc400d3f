"""Loss, learning rate, tokens/s and MFU over steps, as PNG or SVG (matplotlib, loaded here only)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from compiler.errors import UsageError
from compiler.logs.records import StepRecord
from compiler.logs.throughput import StepRates

PLOT_SUFFIXES = (".png", ".svg")


def draw(
    path: Path, steps: Sequence[StepRecord], rates: Sequence[StepRates], title: str, warmup_steps: int = 0
) -> None:
    """Four panels sharing the step axis, the skipped warm-up shaded; a panel with no data says so."""
    if path.suffix.lower() not in PLOT_SUFFIXES:
        raise UsageError(f"--plot {path}: use a .png or .svg file name")
    try:
        import matplotlib
    except ImportError:
        raise UsageError("--plot needs matplotlib: pip install 'lmspec[train]' (or matplotlib)") from None
    matplotlib.use("Agg")
    matplotlib.rcParams["svg.hashsalt"] = "lmspec"  # stable SVG ids: the same log draws the same file
    import matplotlib.pyplot as plt

    panels = [
        ("loss", [(s.step, s.loss) for s in steps if s.loss is not None]),
        ("learning rate", [(s.step, s.lr) for s in steps if s.lr is not None]),
        ("tokens/s", [(r.step, r.tokens_per_s) for r in rates if r.tokens_per_s is not None]),
        ("MFU (%)", [(r.step, 100 * r.mfu) for r in rates if r.mfu is not None]),
    ]
    figure, axes = plt.subplots(4, 1, figsize=(8, 10), sharex=True)
    for axis, (label, points) in zip(axes, panels, strict=True):
        axis.set_ylabel(label)
        axis.grid(True, alpha=0.3)
        if points:
            xs, ys = zip(*points, strict=True)
            axis.plot(xs, ys, marker="." if len(points) < 50 else None)
            if warmup_steps and xs[0] <= warmup_steps:
                axis.axvspan(xs[0], min(warmup_steps, xs[-1]), color="0.85", label="warm-up (not in statistics)")
        else:
            axis.text(0.5, 0.5, "not in this log", ha="center", va="center", transform=axis.transAxes)
    axes[-1].set_xlabel("step")
    if warmup_steps and steps and steps[0].step <= warmup_steps:
        axes[0].legend(loc="upper right")
    figure.suptitle(title)
    figure.tight_layout()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(path, metadata={"Date": None} if path.suffix.lower() == ".svg" else None)
    except OSError as exc:
        raise UsageError(f"--plot {path}: {exc.strerror}") from None
    finally:
        plt.close(figure)
