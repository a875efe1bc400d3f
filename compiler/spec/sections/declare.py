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
