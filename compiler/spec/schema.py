"""Generate the spec's JSON Schema (draft 2020-12) from the typed sections.

The schema in schemas/spec.schema.json is this function's output, committed so
editors and CI tools can use it without lmspec; a test keeps the two equal.
Spec *files* are partial (a group file holds one section, a primary file a
defaults list and a few keys, values may be `${...}` interpolations), so editors
get relaxed variants of the same schema: schemas/spec-file.schema.json and one
schemas/<section>.schema.json per group. `python -m lmspec.compiler.spec.schema` rewrites all.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import json
import types
import typing
from typing import Any, Literal, Union

from lmspec.compiler.spec.kinds import Kind
from lmspec.compiler.spec.sections import Spec

SCHEMA_ID = "https://lmspec.dev/schemas/spec.schema.json"

_SCALARS: dict[type, str] = {bool: "boolean", int: "integer", float: "number", str: "string"}
_BOUND_KEYS = ("minimum", "exclusiveMinimum", "maximum", "kind", "maxItems")
_NUMBER_BOUNDS = ("minimum", "exclusiveMinimum", "maximum")


class UndeclaredBound(TypeError):
    """A key of compiler/spec/sections/ without the bound its type needs (a maximum, a kind)."""


def _string_schema(kind: Kind) -> dict[str, Any]:
    """A string of one kind: `format` names the kind lmspec checks in Python (lmspec.compiler.spec.kinds);
    the length bounds and the ECMA pattern let editors check the same as you type."""
    return {
        "type": "string",
        "format": kind.name,
        "minLength": 1,
        "maxLength": kind.max_length,
        "pattern": kind.anchored,
    }


def _mapping_schema(tp: Any, where: str) -> dict[str, Any]:
    """A `Mapping[K, V]` key: with Literal names K, an object of exactly those (each optional); with str
    names, any names, each value left to a rule (JsonValue: another program's settings, checked against
    that program's own types, as train.megatron.extra against megatron-core's dataclasses)."""
    names, value = typing.get_args(tp)
    if typing.get_origin(names) is Literal:
        properties = {
            name: {**_type_schema(value, {}, f"{where}.{name}"), "description": f"The {name} entry of {where}."}
            for name in typing.get_args(names)
        }
        return {"type": "object", "properties": properties, "additionalProperties": False}
    if names is not str or value is not Any:
        raise UndeclaredBound(f"{where}: a mapping key is Mapping[Literal[...], V] or Mapping[str, JsonValue]")
    return {"type": "object", "additionalProperties": {}}


def _type_schema(tp: Any, bounds: dict[str, Any], where: str) -> dict[str, Any]:
    origin = typing.get_origin(tp)
    if origin in (dict, collections.abc.Mapping):
        return _mapping_schema(tp, where)
    if origin in (Union, types.UnionType):
        options = [_type_schema(arg, bounds, where) for arg in typing.get_args(tp)]
        return {"anyOf": options}
    if origin is Literal:
        values = list(typing.get_args(tp))
        if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            return {"type": "integer", "enum": values}  # an enum alone takes 1.0 for 1
        return {"enum": values}
    if origin is list:
        (item,) = typing.get_args(tp)
        if "maxItems" not in bounds:
            raise UndeclaredBound(f"{where}: a list key needs max_items= in compiler/spec/sections/")
        return {"type": "array", "items": _type_schema(item, bounds, where), "maxItems": bounds["maxItems"]}
    if tp is type(None):
        return {"type": "null"}
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _object_schema(tp, f"{where}.")
    schema: dict[str, Any] = {"type": _SCALARS[tp]}
    if tp in (int, float):
        if "maximum" not in bounds:
            raise UndeclaredBound(f"{where}: a numeric key needs maximum= in compiler/spec/sections/")
        schema.update({k: v for k, v in bounds.items() if k in _NUMBER_BOUNDS})
    if tp is str:
        if "kind" not in bounds:
            raise UndeclaredBound(
                f"{where}: a string key needs kind= (lmspec.compiler.spec.kinds) in compiler/spec/sections/"
            )
        schema = _string_schema(bounds["kind"])
    return schema


def _object_schema(cls: type, where: str = "") -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    properties: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        meta = dict(f.metadata)
        bounds = {k: meta[k] for k in _BOUND_KEYS if k in meta}
        prop = _type_schema(hints[f.name], bounds, f"{where}{f.name}")
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
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": SCHEMA_ID, "title": "lmspec spec"}
    schema.update(_object_schema(Spec))
    return schema


def spec_schema_text() -> str:
    return _text(spec_schema())


def _text(schema: dict[str, Any]) -> str:
    return json.dumps(schema, indent=2, sort_keys=False) + "\n"


_INTERPOLATION = {
    "type": "string",
    "pattern": r"^.*\$\{.+\}.*$",
    "description": "An OmegaConf interpolation, e.g. ${train.seq_length}.",
}
_DEFAULTS = {
    "type": "array",
    "description": "Hydra defaults list: group options and configs to merge before this file.",
    "items": {"anyOf": [{"type": "string"}, {"type": "object"}]},
}
_DOC_KEYS = ("description", "examples")


def _partial(node: dict[str, Any], *, in_any_of: bool = False) -> dict[str, Any]:
    """The same schema with nothing required and `${...}` accepted wherever a value goes."""
    if "properties" in node:
        out = {k: v for k, v in node.items() if k not in ("required", "properties")}
        out["properties"] = {name: _partial(prop) for name, prop in node["properties"].items()}
        return out
    if "anyOf" in node:
        options = [_partial(o, in_any_of=True) for o in node["anyOf"]]
        if not any(o.get("type") in ("object", "string") and "pattern" not in o for o in options):
            options.append(_INTERPOLATION)
        return {**node, "anyOf": options}
    if node.get("type") == "array":
        return {**node, "items": _partial(node["items"])}
    if in_any_of or (node.get("type") == "string" and "pattern" not in node):
        return node
    core = {k: v for k, v in node.items() if k not in _DOC_KEYS}
    docs = {k: v for k, v in node.items() if k in _DOC_KEYS}
    return {"anyOf": [core, _INTERPOLATION], **docs}


def _file_schema(title: str, file_id: str, body: dict[str, Any]) -> dict[str, Any]:
    schema: dict[str, Any] = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID.replace("spec.schema.json", file_id),
        "title": title,
    }
    schema.update(_partial(body))
    schema["properties"] = {"defaults": _DEFAULTS, **schema["properties"]}
    return schema


def section_types() -> dict[str, type]:
    """The spec's sections that are Hydra config groups (model, hardware, ...), each with its dataclass
    (a section the spec may set to null, as train, is `X | None`: its X)."""
    out: dict[str, type] = {}
    for name, hint in typing.get_type_hints(Spec).items():
        options = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
        if len(options) == 1 and isinstance(options[0], type) and dataclasses.is_dataclass(options[0]):
            out[name] = options[0]
    return out


def section_names() -> tuple[str, ...]:
    return tuple(section_types())


def schema_files() -> dict[str, str]:
    """Every file of schemas/: the spec's schema, the spec-file variant, one per group."""
    files = {
        "spec.schema.json": spec_schema_text(),
        "spec-file.schema.json": _text(
            _file_schema(
                "lmspec spec file (partial: defaults list, overrides)", "spec-file.schema.json", _object_schema(Spec)
            )
        ),
    }
    for name, section in section_types().items():
        files[f"{name}.schema.json"] = _text(
            _file_schema(f"lmspec {name} group file", f"{name}.schema.json", _object_schema(section, f"{name}."))
        )
    return files


if __name__ == "__main__":
    from lmspec.compiler.paths import SCHEMA_FILE

    for file_name, text in schema_files().items():
        (SCHEMA_FILE.parent / file_name).write_text(text, encoding="utf-8")
