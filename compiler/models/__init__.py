"""The numbers lmspec derives from a spec: parameters, memory, FLOPs, communication, serving.

Pure arithmetic on the typed spec; imports no torch, so compiling stays fast anywhere.
"""

from typing import Any, TypeAlias

# An int or float, or a numpy array of them: `lmspec plan` evaluates some of these formulas on
# arrays of candidates (compiler/search) with the very arithmetic that prices one spec.
ArrayOrNumber: TypeAlias = Any
