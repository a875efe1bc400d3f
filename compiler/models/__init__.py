"""The numbers lmspec derives from a spec: parameters, memory, FLOPs, communication, serving.

Pure arithmetic on the typed spec; imports no torch, so compiling stays fast anywhere.
"""

from typing import Any, TypeAlias

# An int or float, or a numpy array of them: `lmspec plan` evaluates some of these formulas on
# arrays of candidates (compiler/search) with the very arithmetic that prices one spec.
ArrayOrNumber: TypeAlias = Any


def pick(condition: ArrayOrNumber, if_true: ArrayOrNumber, if_false: ArrayOrNumber) -> ArrayOrNumber:
    """`if_true if condition else if_false`, for a bool or an array of them."""
    return if_false + condition * (if_true - if_false)


def larger(a: ArrayOrNumber, b: ArrayOrNumber) -> ArrayOrNumber:
    """max(a, b), for numbers or arrays (plain arithmetic: one formula prices one layout or a million)."""
    return (a + b + abs(a - b)) / 2


def smaller(a: ArrayOrNumber, b: ArrayOrNumber) -> ArrayOrNumber:
    """min(a, b), for numbers or arrays."""
    return (a + b - abs(a - b)) / 2
