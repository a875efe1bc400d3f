"""A checkpoint save must end inside the collective timeout: while it is written and hashed, every rank
waits in a collective (compiler/models/checkpoint_size.py prices both waits), and NCCL's watchdog
kills the job when one wait outlasts cluster.nccl.timeout_minutes."""

from __future__ import annotations

import math
from collections.abc import Iterator

from lmspec.compiler.errors import Problem, warning
from lmspec.compiler.models.checkpoint_size import CheckpointSize, checkpoint_size
from lmspec.compiler.models.units import GB, SECONDS_PER_MINUTE, TB
from lmspec.compiler.rules.budget import computable
from lmspec.compiler.rules.context import TrainingContext

TIMEOUT_KEY = "cluster.nccl.timeout_minutes"
BANDWIDTH_KEY = "cluster.storage_write_gb_per_s"


def _size(n_bytes: float) -> str:
    return f"{n_bytes / TB:,.2f} TB" if n_bytes >= TB else f"{n_bytes / GB:,.1f} GB"


def _seconds(s: float) -> str:
    return f"{s:,.0f} s ({s / SECONDS_PER_MINUTE:,.1f} min)"


def _fixes(c: CheckpointSize) -> list[str]:
    minutes = math.ceil(c.save_s / SECONDS_PER_MINUTE)
    fixes = [
        f"raise {TIMEOUT_KEY} to {minutes} or more (the watchdog then also waits that long on a real hang)",
    ]
    left = c.timeout_s - c.manifest_s
    if left > 0:
        needed = c.bytes_per_save / left / GB
        fixes.append(
            f"put train.checkpoint.dir on storage that writes {needed:,.1f} GB/s or more and set {BANDWIDTH_KEY} "
            "to what it sustains"
        )
    else:
        fixes.append(
            f"faster storage ({BANDWIDTH_KEY}) alone is not enough: rank 0's manifest hash takes "
            f"{_seconds(c.manifest_s)}"
        )
    fixes.append(
        "an asynchronous save is not offered: lmspec's runtime saves synchronously (train.checkpoint has no async "
        "option), so the timeout must cover the save"
    )
    return fixes


def checkpoint_save_within_timeout(ctx: TrainingContext) -> Iterator[Problem]:
    """A warning: one save (writing + rank 0's manifest hash) outlasts the collective timeout."""
    if not computable(ctx.spec):
        return
    c = checkpoint_size(ctx.spec)
    if not c.outlasts_timeout:
        return
    yield warning(
        TIMEOUT_KEY,
        (
            f"a checkpoint save holds every rank in a collective for {_seconds(c.save_s)}, longer than "
            f"{ctx.show(TIMEOUT_KEY)}: it writes {_size(c.bytes_per_save)} ({c.params:,} parameters x "
            f"{c.bytes_per_param} B of weights and optimizer state) in {_seconds(c.write_s)} at "
            f"{ctx.show(BANDWIDTH_KEY)}, then rank 0 hashes it for the manifest in {_seconds(c.manifest_s)} "
            f"while the others wait in a barrier; fixes: {'; '.join(_fixes(c))}"
        ),
    )


RULES = (checkpoint_save_within_timeout,)
