"""Layer one of validation: the resolved spec against schemas/spec.schema.json.

Every violation becomes one problem naming the dotted key, the bad value, its
origin and what would be accepted; unknown keys get a "did you mean".

The validator is draft 2020-12 with lmspec's own reading of four keywords, so that what
the schema bounds is bounded for every value Python can hold:
- `integer` is an int and never a bool or a float (jsonschema takes 2.0 as an integer);
- `number` is finite (NaN passes every bound comparison, infinity passes `minimum`);
- `format: <kind>` is the string kind of lmspec.compiler.spec.kinds, checked by `Kind.problem`
  (the whole string, ASCII classes, no control character); on such a string the editor's
  approximations (`pattern`, `minLength`, `maxLength`) are left to the kind;
- any other `pattern` is matched whole (re.fullmatch), never searched.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from functools import lru_cache
from typing import Any

from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import ValidationError

from lmspec.compiler.errors import Problem, error
from lmspec.compiler.paths import SCHEMA_FILE
from lmspec.compiler.spec.aliases import lmspec_keys
from lmspec.compiler.spec.kinds import KINDS, control_character
from lmspec.compiler.spec.provenance import Origins
from lmspec.compiler.spec.suggest import did_you_mean


def _is_integer(_checker: Any, instance: Any) -> bool:
    return isinstance(instance, int) and not isinstance(instance, bool)


def _is_number(_checker: Any, instance: Any) -> bool:
    if isinstance(instance, bool) or not isinstance(instance, (int, float)):
        return False
    return not isinstance(instance, float) or math.isfinite(instance)


def _kind_of(schema: dict[str, Any]) -> Any:
    return KINDS.get(schema.get("format", ""))


def _format(_validator: Any, name: str, instance: Any, schema: dict[str, Any]) -> Iterator[ValidationError]:
    kind = KINDS.get(name)
    if kind is not None and isinstance(instance, str):
        reason = kind.problem(instance)
        if reason is not None:
            yield ValidationError(reason)


def _pattern(_validator: Any, pattern: str, instance: Any, schema: dict[str, Any]) -> Iterator[ValidationError]:
    if not isinstance(instance, str) or _kind_of(schema) is not None:
        return
    if re.fullmatch(pattern.removeprefix("^").removesuffix("$"), instance, re.ASCII) is None:
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


def _unless_kind(check: Any) -> Any:
    def keyword(validator: Any, value: Any, instance: Any, schema: dict[str, Any]) -> Any:
        if _kind_of(schema) is None:
            yield from check(validator, value, instance, schema) or ()

    return keyword


_TYPES = Draft202012Validator.TYPE_CHECKER.redefine_many({"integer": _is_integer, "number": _is_number})
LmspecValidator = validators.extend(
    Draft202012Validator,
    validators={
        "format": _format,
        "pattern": _pattern,
        "minLength": _unless_kind(Draft202012Validator.VALIDATORS["minLength"]),
        "maxLength": _unless_kind(Draft202012Validator.VALIDATORS["maxLength"]),
    },
    type_checker=_TYPES,
)


@lru_cache(maxsize=1)
def validator() -> Any:
    return LmspecValidator(json.loads(SCHEMA_FILE.read_text(encoding="utf-8")))


def expected(schema: dict[str, Any]) -> str:
    """What a schema accepts, in words: `an integer >= 1 or 'auto'`."""
    if "anyOf" in schema:
        return " or ".join(expected(option) for option in schema["anyOf"])
    if "enum" in schema:
        return "one of " + ", ".join(repr(v) for v in schema["enum"])
    kind = _kind_of(schema)
    if kind is not None:
        return kind.what
    kind_name = schema["type"]  # every schema left here has one (a missing one was a KeyError below)
    words = {
        "integer": "an integer",
        "number": "a number",
        "boolean": "true or false",
        "string": "a string",
        "null": "null",
        "array": "a list",
        "object": "a mapping",
    }[kind_name]
    bounds = [
        f">= {schema['minimum']}" if "minimum" in schema else "",
        f"> {schema['exclusiveMinimum']}" if "exclusiveMinimum" in schema else "",
        f"<= {schema['maximum']}" if "maximum" in schema else "",
        f"matching {schema['pattern']}" if "pattern" in schema else "",
    ]
    if kind_name == "array" and "items" in schema:
        words += " of " + expected(schema["items"]).removeprefix("an ").removeprefix("a ") + "s"
    return " ".join([words, *[b for b in bounds if b]])


def shown_as_json(value: Any) -> str:
    """A value as JSON for a message; one too large to print whole is described instead."""
    try:
        return json.dumps(value, ensure_ascii=True)
    except ValueError:  # an int beyond Python's str() digit limit
        return f"<an integer of about {int(value.bit_length() * 0.30103)} digits>"


def _printable_key(name: str) -> str:
    return name if control_character(name) is None and name.isprintable() else json.dumps(name)


def _dotted(path: Any) -> str:
    return ".".join(_printable_key(str(p)) for p in path)


def _number_hint(key: str, value: Any, schema: dict[str, Any]) -> str:
    """What is wrong with a number that a bound does not say: NaN, a bool, 2.0 for an integer."""
    if isinstance(value, bool):
        return f"; {shown_as_json(value)} is a boolean, not a number"
    if isinstance(value, float) and not math.isfinite(value):
        return "; NaN and infinities are not accepted, use a finite number"
    wants_int = schema.get("type") == "integer" or any(o.get("type") == "integer" for o in schema.get("anyOf", []))
    if isinstance(value, float) and wants_int and value.is_integer() and abs(value) < 2**63:
        return f"; write a whole number without a decimal point: {key}={int(value)}"
    return ""


def _at(root: Any, path: list[Any]) -> Any:
    for part in path:
        root = root[part]
    return root


def _example(path: list[Any], default: str) -> str:
    """The example compiler/spec/sections/ gives for the key at `path` (a list item: the list's first)."""
    node: dict[str, Any] = validator().schema
    for part in path:
        if isinstance(part, int):
            break
        options = [node, *node.get("anyOf", [])]
        node = next((o["properties"][part] for o in options if part in o.get("properties", {})), {})
    example = (node.get("examples") or [default])[0]
    return str(example[0] if isinstance(example, list) and example else example)


def _kind_problem(err: ValidationError, origins: Origins, root: Any) -> Problem:
    """A string that is not of its key's kind: the kind, the reason, why it matters, an example."""
    kind = KINDS[err.schema["format"]]
    path = list(err.absolute_path)
    example = _example(path, kind.example)
    pattern = f" matching {kind.anchored}" if kind.shows_pattern else ""
    why = f"; {kind.why}" if kind.why else ""
    if path and isinstance(path[-1], int):  # an item of a list of strings
        key = _dotted(path[:-1])
        return error(
            key,
            f"{key}={shown_as_json(_at(root, path[:-1]))} ({origins.of(key)}): item {path[-1]}: {err.instance!r} "
            f"is not {kind.what}{pattern} ({err.message}){why}; e.g. {example}",
        )
    key = _dotted(path)
    return error(
        key,
        f"{key}={shown_as_json(err.instance)} ({origins.of(key)}): expected {kind.what}{pattern}; {err.message}{why}; "
        f"e.g. {key}={example}",
    )


def _branch_errors(err: ValidationError) -> list[ValidationError] | None:
    """For an anyOf, the errors of the one option of the value's own type (a string's kind,
    a list's items), when exactly one option has that type; else None."""
    options = err.schema["anyOf"]
    own = [i for i, o in enumerate(options) if "type" in o and validator().is_type(err.instance, o["type"])]
    if len(own) != 1:
        return None
    return [e for e in err.context if e.relative_schema_path and e.relative_schema_path[0] == own[0]]


def _problem(err: ValidationError, origins: Origins, root: Any) -> list[Problem]:
    key = _dotted(err.absolute_path)
    where = origins.of(key) if key else "spec"
    if err.validator == "additionalProperties":
        allowed = list(err.schema["properties"])
        unknown = sorted(set(err.instance) - set(allowed))
        out = []
        for name in unknown:
            full = f"{key}.{_printable_key(name)}" if key else _printable_key(name)
            full_allowed = [f"{key}.{a}" if key else a for a in allowed]
            out.append(
                error(
                    full,
                    f"{full} ({origins.of(full)}): unknown key{_alias_or_nearest(full, full_allowed)} "
                    f"Keys allowed in {key or 'the spec'}: {', '.join(allowed)}",
                )
            )
        return out
    if err.validator == "required":
        missing = err.message.split("'")[1]
        full = f"{key}.{missing}" if key else missing
        return [
            error(
                full,
                f"{full}: missing (required in {key or 'the spec'}, {where}); set it in the spec or with +{full}=...",
            )
        ]
    if err.validator == "format" and err.schema.get("format") in KINDS:
        return [_kind_problem(err, origins, root)]
    if err.validator == "anyOf":
        branch = _branch_errors(err)
        if branch:
            return [p for sub in branch for p in _problem(sub, origins, root)]
    hint = _number_hint(key, err.instance, err.schema)
    return [error(key, f"{key}={shown_as_json(err.instance)} ({where}): expected {expected(err.schema)}{hint}")]


def schema_problems(spec: dict[str, Any], origins: Origins) -> list[Problem]:
    """All schema violations of `spec`, one problem per key."""
    problems: list[Problem] = []
    seen: set[tuple[str, str]] = set()
    for err in validator().iter_errors(spec):
        for problem in _problem(err, origins, spec):
            if (problem.key, problem.message) not in seen:
                seen.add((problem.key, problem.message))
                problems.append(problem)
    return problems


def _alias_or_nearest(key: str, allowed: list[str]) -> str:
    """The key lmspec uses for a name people type (tensor_model_parallel_size), else the nearest key."""
    keys = lmspec_keys(key)
    return f"; lmspec calls it {' or '.join(keys)}." if keys else did_you_mean(key, allowed)
