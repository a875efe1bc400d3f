"""Generate the spec's JSON Schema (draft 2020-12) from the typed sections.

The schema in schemas/spec.schema.json is this function's output, committed so
editors and CI tools can use it without lmspec; a test keeps the two equal.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from typing import Any, Literal, Union

from compiler.sections import Spec

SCHEMA_ID = "https://lmspec.dev/schemas/spec.schema.json"

_SCALARS: dict[type, str] = {bool: "boolean", int: "integer", float: "number", str: "string"}
_BOUND_KEYS = ("minimum", "exclusiveMinimum", "maximum", "pattern")


def _type_schema(tp: Any, bounds: dict[str, Any]) -> dict[str, Any]:
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        options = [_type_schema(arg, bounds) for arg in typing.get_args(tp)]
        return {"anyOf": options}
    if origin is Literal:
        return {"enum": list(typing.get_args(tp))}
    if origin is list:
        (item,) = typing.get_args(tp)
        return {"type": "array", "items": _type_schema(item, bounds)}
    if tp is type(None):
        return {"type": "null"}
    if dataclasses.is_dataclass(tp):
        return _object_schema(tp)
    schema: dict[str, Any] = {"type": _SCALARS[tp]}
    if tp in (int, float):
        schema.update({k: v for k, v in bounds.items() if k in ("minimum", "exclusiveMinimum", "maximum")})
    if tp is str and "pattern" in bounds:
        schema["pattern"] = bounds["pattern"]
    return schema


def _object_schema(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    properties: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        meta = dict(f.metadata)
        bounds = {k: meta[k] for k in _BOUND_KEYS if k in meta}
        prop = _type_schema(hints[f.name], bounds)
        prop["description"] = meta["description"]
        if "example" in meta:
            prop["examples"] = [meta["example"]]
        properties[f.name] = prop
    return {
        "type": "object",
        "description": (cls.__doc__ or "").strip().splitlines()[0],
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }


def spec_schema() -> dict[str, Any]:
    """The whole spec's schema, every key with a description and an example."""
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": SCHEMA_ID,
              "title": "lmspec spec"}
    schema.update(_object_schema(Spec))
    return schema


def spec_schema_text() -> str:
    return json.dumps(spec_schema(), indent=2, sort_keys=False) + "\n"
