"""DeepSpeed 0.19.8 on a machine without CUDA: its distributed backend starts without building a C++ op.

`deepspeed.init_distributed` makes a `deepspeed.comm.torch.TorchBackend`, whose constructor
calls the module function `build_shm_op()`. With the CPU accelerator that JIT-compiles a
shared-memory collective op (40-75 s and ~4 GB of RAM here) that gloo makes unnecessary: gloo
runs the same collectives. Inside `no_cpu_shm_op_build()` that function answers None, which
is what it answers itself where the op is unavailable, so the backend uses torch.distributed.
Optional: on another DeepSpeed release the patch is skipped with a warning (DeepSpeed then
builds the op, slowly but correctly) rather than guessing at its internals.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from lmspec.runtime.compat.seam import expect, swapped

SEAM = "lmspec.runtime.compat.deepspeed"
DEEPSPEED = "0.19.8"
SKIPPED = "DeepSpeed builds its shared-memory op as it would without lmspec (slow on a CPU, but correct)"


def _no_op() -> None:
    return None


@contextmanager
def no_cpu_shm_op_build() -> Iterator[bool]:
    """On a machine without CUDA, DeepSpeed's backends made inside the block build no shared-memory
    op; yields whether the build is skipped. Wrap `deepspeed.init_distributed` only."""
    if torch.cuda.is_available() or not expect(SEAM, "deepspeed", DEEPSPEED, SKIPPED):
        yield False
        return
    # Not `import deepspeed.comm.torch as ...`: `deepspeed.comm` re-exports torch itself under that name,
    # so the `as` form binds torch (and a patch of it changes nothing, as lmspec's first one did).
    ds_torch = importlib.import_module("deepspeed.comm.torch")
    with swapped(ds_torch, "build_shm_op", _no_op):
        yield True
