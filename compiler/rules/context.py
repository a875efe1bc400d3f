"""What every rule gets: the typed spec, where each value came from, and a formatter."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import reduce
from typing import Any

from compiler.provenance import Origins
from compiler.sections import Spec


@dataclass(frozen=True)
class RuleContext:
    spec: Spec
    origins: Origins

    def value(self, key: str) -> Any:
        return reduce(getattr, key.split("."), self.spec)

    def show(self, key: str) -> str:
        """`parallel.tp=6 (command-line override)`: the key, its value and its origin."""
        value = self.value(key)
        shown = json.dumps(list(value) if isinstance(value, tuple) else value)
        return f"{key}={shown} ({self.origins.of(key)})"

    def sources(self, *keys: str) -> str:
        """`parallel.tp from command-line override; hardware.nodes from ...`: where factors came from."""
        return "; ".join(f"{k} from {self.origins.of(k)}" for k in keys)

    def factor(self, key: str) -> str:
        """`parallel.tp(8)`: a factor of a product, for messages that print every factor."""
        return f"{key}({self.value(key)})"
