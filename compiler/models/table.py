"""The per-GPU memory breakdown as a rich table for terminals, labelled in GiB and GB
(sources mix them: vendors label GB, PyTorch reports GiB)."""

from __future__ import annotations

import io

from lmspec.compiler.models.train_memory import TrainMemory
from lmspec.compiler.models.units import GB, GIB

TABLE_WIDTH = 100  # fixed, so the text is the same on every terminal


def memory_table_text(memory: TrainMemory, title: str) -> str:
    from rich.console import Console
    from rich.table import Table

    worst = memory.worst
    several = len(memory.stages) > 1
    table = Table(title=title, title_justify="left")
    table.add_column("term")
    table.add_column("GiB (2^30 B)", justify="right")
    table.add_column("GB (10^9 B)", justify="right")
    for term, value in worst.terms().items():
        table.add_row(term, f"{value / GIB:,.2f}", f"{value / GB:,.2f}")
    table.add_row(
        "total" + (f" (stage {worst.stage} of {len(memory.stages)})" if several else ""),
        f"{worst.total_bytes / GIB:,.2f}",
        f"{worst.total_bytes / GB:,.2f}",
        style="bold",
    )
    table.add_row("usable", f"{memory.budget_bytes / GIB:,.2f}", f"{memory.budget_bytes / GB:,.2f}")
    out = io.StringIO()
    Console(file=out, width=TABLE_WIDTH, color_system=None, force_terminal=False).print(table)
    verdict = "fits" if memory.fits else "does NOT fit"
    return out.getvalue() + f"training memory per GPU: {verdict}\n"
