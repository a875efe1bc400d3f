"""Turn a schema-valid resolved spec (plain dict) into the typed sections."""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import TYPE_CHECKING, Any, TypeVar, Union

if TYPE_CHECKING:
    from compiler.sections import Spec

T = TypeVar("T")


def _convert(tp: Any, value: Any) -> Any:
    origin = typing.get_origin(tp)
    if value is None:
        return None
    if origin in (Union, types.UnionType):
        for arg in typing.get_args(tp):
            if dataclasses.is_dataclass(arg) and isinstance(value, dict):
                return from_dict(arg, value)
        return tuple(value) if isinstance(value, list) else value
    if origin is list:
        return tuple(value)
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value)
    if tp is float:
        return float(value)
    return value


def from_dict(cls: type[T], data: dict[str, Any]) -> T:
    """Build `cls` from a dict the schema has already accepted (lists become tuples)."""
    hints = typing.get_type_hints(cls)
    kwargs = {f.name: _convert(hints[f.name], data[f.name]) for f in dataclasses.fields(cls)}
    return cls(**kwargs)


def checked_spec(data: Any, source: str) -> Spec:
    """The typed Spec of data read back from a file (a build's spec.resolved.yaml), after the
    same schema check a compile makes: a hand-edited NaN, 2.0 or newline is a SpecError naming
    the key and `source`, never a TypeError (or a NaN) deep inside the runtime."""
    from compiler.errors import SpecError, error
    from compiler.provenance import Origins
    from compiler.schema_check import schema_problems
    from compiler.sections import Spec

    if not isinstance(data, dict):
        raise SpecError([error("<file>", f"{source}: expected a mapping of spec keys, got {type(data).__name__}")])
    problems = schema_problems(data, Origins({str(key): source for key in data}))
    if problems:
        raise SpecError(problems)
    return from_dict(Spec, data)
