"""spec.resolved.yaml (what was compiled) and plan.json (what lmspec derived from it)."""

from __future__ import annotations

import json
import math
import re
from typing import Any

import yaml

from lmspec.compiler.build.files import PLAN, SPEC
from lmspec.compiler.plan import Plan

_Dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)  # libyaml: same text, 4x faster
SCHEMA_HEADER = "# yaml-language-server: $schema=https://lmspec.dev/schemas/spec.schema.json\n"


class NonFiniteNumber(ValueError):
    """A derived number is NaN or infinite: JSON has no such value, so no artifact is written."""


def _non_finite(data: Any, path: str = "") -> str:
    """The dotted path of the first NaN or infinity in `data`, for the error."""
    if isinstance(data, float) and not math.isfinite(data):
        return f"{path or '<root>'}={data}"
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, (list, tuple)) else ()
    for key, value in items:
        found = _non_finite(value, f"{path}.{key}" if path else str(key))
        if found:
            return found
    return ""


def _encoded(encoder: json.JSONEncoder, data: object) -> str:
    try:
        return encoder.encode(data)
    except ValueError:
        where = _non_finite(data)
        if not where:
            raise
        raise NonFiniteNumber(f"{where}: lmspec writes only finite numbers into JSON artifacts") from None


# Every JSON artifact is standard JSON (allow_nan=False): NaN or Infinity is refused, never written.
_INDENTED = json.JSONEncoder(indent=2, sort_keys=True, ensure_ascii=False, allow_nan=False)
_ONE_LINE = json.JSONEncoder(sort_keys=True, ensure_ascii=False, allow_nan=False)
_SCALAR = json.JSONEncoder(ensure_ascii=False, allow_nan=False)  # a YAML value of vllm.yaml: see dump_json_scalar
# What a YAML reader does not take back as itself inside a double-quoted scalar: characters outside YAML's
# printable set (DEL, C1 controls, surrogates, U+FFFE/FFFF) and the line breaks YAML 1.1 folds (NEL, LS, PS).
_YAML_UNSAFE = re.compile("[\x7f-\x9f\u2028\u2029\ud800-\udfff\ufffe\uffff]")


def dump_json(data: object) -> str:
    """Stable JSON for artifacts: sorted keys, two-space indent, trailing newline, finite numbers only."""
    return _encoded(_INDENTED, data) + "\n"


def dump_json_line(data: object) -> str:
    """One JSON value on one line (a row of a table artifact): sorted keys, finite numbers only."""
    return _encoded(_ONE_LINE, data)


def dump_json_scalar(value: object) -> str:
    """One JSON scalar that is also a YAML 1.1 scalar reading back as the same value: vllm.yaml's values.

    Characters are written as themselves, not as JSON's `\\uXXXX`: for a character beyond the BMP (an
    emoji) that escape is a surrogate pair, which YAML reads as two lone surrogates, not the character.
    Only what YAML would not read back as itself is escaped, each a BMP character JSON and YAML agree on."""
    text = _encoded(_SCALAR, value)
    return _YAML_UNSAFE.sub(lambda m: f"\\u{ord(m.group(0)):04x}", text)


def emit_resolved_spec(plan: Plan) -> dict[str, str]:
    body = yaml.dump(
        plan.spec_dict(), Dumper=_Dumper, sort_keys=False, default_flow_style=False, allow_unicode=True, width=1000
    )
    header = (
        "# The resolved spec this build was compiled from (every default, group choice and\n"
        "# override applied). The runtime reads it; `lmspec compile --spec` accepts it unchanged.\n"
    )
    return {SPEC: SCHEMA_HEADER + header + body}


def emit_plan_json(plan: Plan) -> dict[str, str]:
    return {PLAN: dump_json(plan.to_document())}
