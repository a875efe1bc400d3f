"""What every rule gets: the typed spec, where each value came from, and a formatter."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import reduce
from typing import Any, Generic, TypeVar

from lmspec.compiler.spec.provenance import Origins
from lmspec.compiler.spec.sections import ServingSpec, Spec, TrainingSpec

S = TypeVar("S", bound=Spec)


@dataclass(frozen=True)
class SpecContext(Generic[S]):
    """A rule's view: `spec` is the whole spec (RuleContext), or the spec narrowed to the part the
    rule judges (TrainingContext, ServingContext), which runs only when that part is present."""

    spec: S
    origins: Origins

    def value(self, key: str) -> Any:
        """The key's value; None under a section the spec sets to null (`train.seq_length` of train: null)."""
        return reduce(lambda node, part: None if node is None else getattr(node, part), key.split("."), self.spec)

    def show(self, key: str) -> str:
        """`parallel.tp=6 (command-line override)`: the key, its value and its origin."""
        shown = json.dumps(_plain(self.value(key)))
        return f"{key}={shown} ({self.origins.of(key)})"

    def sources(self, *keys: str) -> str:
        """`parallel.tp from command-line override; hardware.nodes from ...`: where factors came from."""
        return "; ".join(f"{k} from {self.origins.of(k)}" for k in keys)

    def factor(self, key: str) -> str:
        """`parallel.tp(8)`: a factor of a product, for messages that print every factor."""
        return f"{key}({self.value(key)})"


RuleContext = SpecContext[Spec]
TrainingContext = SpecContext[TrainingSpec]
ServingContext = SpecContext[ServingSpec]


HINT_VALUES = 8  # a hint lists at most this many values, however many would do


def listed(values: Sequence[object], limit: int = HINT_VALUES) -> str:
    """Values for a hint, at most `limit` of them: `1, 2, 3, 4, 6, 8, ..., 5000, 10000 (36 values)`."""
    if len(values) <= limit:
        return ", ".join(map(str, values))
    head, tail = values[: limit - 2], values[-2:]
    return f"{', '.join(map(str, head))}, ..., {', '.join(map(str, tail))} ({len(values)} values)"


def _plain(value: Any) -> Any:
    """A typed value as JSON data: a section (e.g. a filled-in model.mla) as a mapping, tuples as lists."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {k: _plain(v) for k, v in dataclasses.asdict(value).items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
