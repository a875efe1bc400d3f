"""Loss, learning rate, tokens/s and MFU over steps, as PNG or SVG (matplotlib, loaded here only)."""

from __future__ import annotations

import io
from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from lmspec.compiler.build.atomic import write_file_atomic
from lmspec.compiler.errors import UsageError
from lmspec.compiler.observe.logs.context import RunContext
from lmspec.compiler.observe.logs.throughput import rates_of
from lmspec.compiler.observe.metrics_record import StepMetrics

PLOT_SUFFIXES = (".png", ".svg")
_IMAGE_PREFIXES = {".png": b"\x89PNG\r\n\x1a\n", ".svg": b"<?xml"}  # how an existing plot file begins
_LABELS = ("loss", "learning rate", "tokens/s", "MFU (%)")
MAX_PLOT_POINTS = 20_000  # per panel: 25 per pixel column of the 8-inch figure; more only costs memory


@dataclass
class Panels:
    """The points of the four panels, as compact columns (x: step, y: value), read in one pass."""

    xs: dict[str, array] = field(default_factory=lambda: {label: array("q") for label in _LABELS})
    ys: dict[str, array] = field(default_factory=lambda: {label: array("d") for label in _LABELS})
    first_step: int | None = None

    def add(self, label: str, step: int, value: float | None) -> None:
        if value is not None:
            self.xs[label].append(step)
            self.ys[label].append(value)


def panels_of(records: Iterable[StepMetrics], context: RunContext | None, log_seq_length: int | None) -> Panels:
    panels = Panels()
    for record in records:
        if panels.first_step is None:
            panels.first_step = record.step
        rate = rates_of(record, context, log_seq_length)
        panels.add("loss", record.step, record.loss)
        panels.add("learning rate", record.step, record.lr)
        panels.add("tokens/s", record.step, rate.tokens_per_s)
        panels.add("MFU (%)", record.step, None if rate.mfu is None else 100 * rate.mfu)
    return panels


def thinned(xs: array, ys: array, limit: int = MAX_PLOT_POINTS) -> tuple[array | np.ndarray, array | np.ndarray]:
    """At most `limit` points: past it, the lowest and highest point of each run of consecutive
    steps (in step order), so spikes stay visible; NaN/inf points only where a run has nothing else."""
    if len(xs) <= limit:
        return xs, ys
    x, y = np.frombuffer(xs, dtype=np.int64), np.frombuffer(ys, dtype=np.float64)
    per = -(-len(x) // (limit // 2))  # points per run
    pad = (-len(y)) % per
    finite = np.isfinite(y)
    low = np.pad(np.where(finite, y, np.inf), (0, pad), constant_values=np.inf).reshape(-1, per)
    high = np.pad(np.where(finite, y, -np.inf), (0, pad), constant_values=-np.inf).reshape(-1, per)
    base = np.arange(low.shape[0]) * per
    keep = np.unique(np.concatenate((base + low.argmin(axis=1), base + high.argmax(axis=1))))
    keep = keep[keep < len(x)]
    return x[keep], y[keep]


def check_plot_path(path: Path) -> None:
    if path.suffix.lower() not in PLOT_SUFFIXES:
        raise UsageError(f"--plot {path}: use a .png or .svg file name")


def draw(path: Path, panels: Panels, title: str, warmup_steps: int = 0) -> None:
    """Four panels sharing the step axis, the skipped warm-up shaded; a panel with no data says so."""
    check_plot_path(path)
    try:
        import matplotlib
    except ImportError:
        raise UsageError("--plot needs matplotlib: pip install 'lmspec[train]' (or matplotlib)") from None
    matplotlib.use("Agg")
    matplotlib.rcParams["svg.hashsalt"] = "lmspec"  # stable SVG ids: the same log draws the same file
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(4, 1, figsize=(8, 10), sharex=True)
    for axis, label in zip(axes, _LABELS, strict=True):
        axis.set_ylabel(label)
        axis.grid(True, alpha=0.3)
        xs, ys = thinned(panels.xs[label], panels.ys[label])
        if len(xs):
            axis.plot(xs, ys, marker="." if len(xs) < 50 else None)
            if warmup_steps and xs[0] <= warmup_steps:
                axis.axvspan(xs[0], min(warmup_steps, xs[-1]), color="0.85", label="warm-up (not in statistics)")
        else:
            axis.text(0.5, 0.5, "not in this log", ha="center", va="center", transform=axis.transAxes)
    axes[-1].set_xlabel("step")
    if warmup_steps and panels.first_step is not None and panels.first_step <= warmup_steps:
        axes[0].legend(loc="upper right")
    figure.suptitle(title)
    figure.tight_layout()
    image = io.BytesIO()
    suffix = path.suffix.lower()
    try:
        figure.savefig(image, format=suffix[1:], metadata={"Date": None} if suffix == ".svg" else None)
    finally:
        plt.close(figure)
    # whole or not at all (a full disk leaves no truncated image); replaces only an image of the same kind
    write_file_atomic(path, image.getvalue(), owned_prefix=_IMAGE_PREFIXES[suffix])
