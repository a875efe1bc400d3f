"""Tensor dtypes by the names mapping.json and checkpoints use ("bfloat16"), and torch's.

Byte sizes come from the compiler's table (lmspec.compiler.models.units.DTYPE_BYTES), so
the compiler's estimates and the runtime's copies agree on them. torch is imported only
when a torch dtype is asked for: the converter's direct path never needs it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lmspec.compiler.models.units import DTYPE_BYTES

if TYPE_CHECKING:
    import torch

__all__ = ["DTYPE_BYTES", "dtype_name", "torch_dtype"]


def torch_dtype(name: str) -> torch.dtype:
    import torch

    return getattr(torch, name)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
