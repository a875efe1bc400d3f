"""Turn a schema-valid resolved spec (plain dict) into the typed sections."""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import TYPE_CHECKING, Any, TypeVar, Union

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T", bound="DataclassInstance")


def _convert(tp: Any, value: Any) -> Any:
    origin = typing.get_origin(tp)
    if value is None:
        return None
    if origin in (Union, types.UnionType):
        for arg in typing.get_args(tp):
            if isinstance(arg, type) and dataclasses.is_dataclass(arg) and isinstance(value, dict):
                return from_dict(arg, value)
            if typing.get_origin(arg) is list and isinstance(value, list):
                return _convert(arg, value)
        return value
    if origin is list:
        (item,) = typing.get_args(tp)
        return tuple(_convert(item, v) for v in value)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return from_dict(tp, value)
    if tp is float:
        return float(value)
    return value


def from_dict(cls: type[T], data: dict[str, Any]) -> T:
    """Build `cls` from a dict the schema has already accepted (lists become tuples)."""
    kwargs = {name: _convert(hint, data[name]) for name, hint in _field_hints(cls)}
    return cls(**kwargs)


@functools.cache
def _field_hints(cls: type[DataclassInstance]) -> tuple[tuple[str, Any], ...]:
    """(field name, resolved type) of each field of a section, once per class: resolving the string
    annotations is most of what turning a spec into its sections takes (Build.open does it on every rank)."""
    hints = typing.get_type_hints(cls)
    return tuple((f.name, hints[f.name]) for f in dataclasses.fields(cls))
