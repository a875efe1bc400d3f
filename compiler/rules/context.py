"""What every rule gets: the typed spec, where each value came from, what the compile read, and a formatter."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from lmspec.compiler.inputs import NOTHING_READ, CompileInputs
from lmspec.compiler.spec.provenance import Origins
from lmspec.compiler.spec.sections import ServingSpec, Spec, TrainingSpec
from lmspec.compiler.spec.shown_key import show_key, value_at

S = TypeVar("S", bound=Spec)


@dataclass(frozen=True)
class SpecContext(Generic[S]):
    """A rule's view: `spec` is the whole spec (RuleContext), or the spec narrowed to the part the
    rule judges (TrainingContext, ServingContext), which runs only when that part is present."""

    spec: S
    origins: Origins
    # What the compile read from the machine (compiler/inputs.py): the only facts beyond the spec a
    # rule may use. A rule called outside a compile (the search, the runtime) reads none of them.
    inputs: CompileInputs = NOTHING_READ

    def value(self, key: str) -> Any:
        """The key's value; None under a section the spec sets to null (`train.seq_length` of train: null)."""
        return value_at(self.spec, key)

    def show(self, key: str) -> str:
        """`parallel.tp=6 (command-line override)`: the key, its value and its origin (compiler/spec/shown_key.py)."""
        return show_key(self.spec, self.origins, key)

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
