"""How a spec key is declared: `key()` puts its description, example and bounds on the dataclass field,
where compiler/spec/schema.py reads them; every section module declares its keys with it, so the
schema, the validation and the documentation all come from one line per key."""

from __future__ import annotations

from dataclasses import field
from typing import Any, Literal

from lmspec.compiler.spec.kinds import Kind


def key(
    description: str,
    *,
    example: Any = None,
    minimum: float | None = None,
    exclusive_minimum: float | None = None,
    maximum: float | None = None,
    kind: Kind | None = None,
    max_items: int | None = None,
) -> Any:
    """Declare a spec key: its description, one example, its numeric bounds or its string kind.

    Every number needs a maximum and every string a kind (lmspec.compiler.spec.kinds); lmspec.compiler.spec.schema
    refuses to generate a schema for a key without one."""
    meta = {
        "description": description,
        "example": example,
        "minimum": minimum,
        "exclusiveMinimum": exclusive_minimum,
        "maximum": maximum,
        "kind": kind,
        "maxItems": max_items,
    }
    return field(metadata={k: v for k, v in meta.items() if v is not None})


Auto = Literal["auto"]  # a key typed `X | Auto`: lmspec derives its value (parallel.dp, serve.multi_node, ...)

# A key typed `Mapping[str, JsonValue]` holds settings lmspec passes on to another program, which decides
# their names and types (train.megatron.extra: megatron-core's config dataclasses); the schema accepts any
# JSON value there, and a rule checks each against the program's own types.
JsonValue = Any


class FrozenMapping(dict[str, Any]):
    """A mapping key's value in a typed section: read-only and hashable, as the frozen sections around it
    (its nested mappings frozen too, its lists tuples). A dict subclass, so JSON and YAML write it as one."""

    def __init__(self, items: Any = ()) -> None:
        super().__init__((k, frozen_value(v)) for k, v in dict(items).items())

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(sorted(self.items())))

    def __reduce__(self) -> tuple[Any, ...]:  # pickle and copy rebuild it whole, never item by item
        return (FrozenMapping, (dict(self),))

    def _read_only(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("a spec section's mapping is read-only; use dataclasses.replace with a new one")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = __ior__ = _read_only


def frozen_value(value: Any) -> Any:
    """`value` with every mapping a FrozenMapping and every list a tuple."""
    if isinstance(value, dict):
        return value if isinstance(value, FrozenMapping) else FrozenMapping(value)
    if isinstance(value, (list, tuple)):
        return tuple(frozen_value(v) for v in value)
    return value
