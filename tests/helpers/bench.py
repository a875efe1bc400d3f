"""The scripts under bench/ as modules, for tests that check what they measure."""

from __future__ import annotations

import importlib
import sys
from types import ModuleType

from helpers.paths import ROOT


def bench_module(name: str) -> ModuleType:
    """bench/NAME.py, imported as NAME (the scripts import each other by that name)."""
    folder = str(ROOT / "bench")
    if folder not in sys.path:
        sys.path.insert(0, folder)
    return importlib.import_module(name)
