"""Layer one of validation: the resolved spec against schemas/spec.schema.json.

Every violation becomes one problem naming the dotted key, the bad value, its
origin and what would be accepted; unknown keys get a "did you mean".
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError

from compiler.errors import Problem, error
from compiler.load import did_you_mean
from compiler.paths import SCHEMA_FILE
from compiler.provenance import Origins


@lru_cache(maxsize=1)
def validator() -> Draft202012Validator:
    return Draft202012Validator(json.loads(SCHEMA_FILE.read_text(encoding="utf-8")))


def expected(schema: dict[str, Any]) -> str:
    """What a schema accepts, in words: `an integer >= 1 or 'auto'`."""
    if "anyOf" in schema:
        return " or ".join(expected(option) for option in schema["anyOf"])
    if "enum" in schema:
        return "one of " + ", ".join(repr(v) for v in schema["enum"])
    kind = schema.get("type")
    words = {
        "integer": "an integer",
        "number": "a number",
        "boolean": "true or false",
        "string": "a string",
        "null": "null",
        "array": "a list",
        "object": "a mapping",
    }[kind]
    bounds = [
        f">= {schema['minimum']}" if "minimum" in schema else "",
        f"> {schema['exclusiveMinimum']}" if "exclusiveMinimum" in schema else "",
        f"<= {schema['maximum']}" if "maximum" in schema else "",
        f"matching {schema['pattern']}" if "pattern" in schema else "",
    ]
    if kind == "array" and "items" in schema:
        words += " of " + expected(schema["items"]).removeprefix("an ").removeprefix("a ") + "s"
    return " ".join([words, *[b for b in bounds if b]])


def _dotted(path: Any) -> str:
    return ".".join(str(p) for p in path)


def _problem(err: ValidationError, origins: Origins) -> list[Problem]:
    key = _dotted(err.absolute_path)
    where = origins.of(key) if key else "spec"
    if err.validator == "additionalProperties":
        allowed = list(err.schema["properties"])
        unknown = sorted(set(err.instance) - set(allowed))
        out = []
        for name in unknown:
            full = f"{key}.{name}" if key else name
            full_allowed = [f"{key}.{a}" if key else a for a in allowed]
            out.append(
                error(
                    full,
                    f"{full} ({origins.of(full)}): unknown key{did_you_mean(full, full_allowed)} "
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
    value = json.dumps(err.instance)
    return [error(key, f"{key}={value} ({where}): expected {expected(err.schema)}")]


def schema_problems(spec: dict[str, Any], origins: Origins) -> list[Problem]:
    """All schema violations of `spec`, one problem per key."""
    problems: list[Problem] = []
    for err in validator().iter_errors(spec):
        problems.extend(_problem(err, origins))
    return problems
