"""Pareto plot of the layouts that fit: memory per GPU against tokens/s (matplotlib, lazily)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from lmspec.compiler.errors import UsageError
from lmspec.compiler.models.units import GIB
from lmspec.compiler.search.search import SearchResult

MAX_POINTS = 20000  # feasible layouts drawn as the grey cloud (a deterministic stride beyond this)


def pareto_front(memory: np.ndarray, tokens_per_s: np.ndarray) -> np.ndarray:
    """Indices of layouts no other layout beats on both less memory and more tokens/s, by memory."""
    order = np.lexsort((-tokens_per_s, memory))
    best = np.maximum.accumulate(tokens_per_s[order])
    improves = np.concatenate(([True], tokens_per_s[order][1:] > best[:-1]))
    return order[improves]


def draw(path: Path, result: SearchResult) -> None:
    if path.suffix.lower() not in (".png", ".svg"):
        raise UsageError(f"--plot {path}: use a .png or .svg file name")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UsageError("--plot needs matplotlib: pip install matplotlib") from None
    p = result.priced
    memory, tps = p.feasible.memory_bytes / GIB, p.tokens_per_s
    winner = int(result.ranked[0])
    stride = max(memory.size // MAX_POINTS, 1)
    front = pareto_front(memory, tps)
    fig, ax = plt.subplots(figsize=(8, 5))
    ax.scatter(memory[::stride], tps[::stride], s=4, color="0.75", label=f"{memory.size:,} layouts that fit")
    ax.step(memory[front], tps[front], where="post", color="tab:blue", label="Pareto front")
    ax.scatter(memory[winner], tps[winner], s=60, color="tab:red", zorder=3, label="winner")
    ax.axvline(p.budget_bytes / GIB, color="tab:red", linestyle="--", linewidth=1, label="memory budget")
    ax.set_xlabel("memory per GPU (GiB, worst stage)")
    ax.set_ylabel("estimated tokens/s")
    ax.set_title(f"{result.spec.model.name} on {result.spec.hardware.gpu.name}: objective {result.objective}")
    ax.legend(loc="lower right")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, metadata={"Date": None} if path.suffix.lower() == ".svg" else None)
    plt.close(fig)
