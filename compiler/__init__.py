"""lmspec's compiler: spec -> validated Plan -> deterministic artifacts. Imports no torch."""

__version__ = "0.1.0"
