"""Every number at the edge of what the schema accepts: either a clear SpecError, or every
artifact built, with standard JSON. Never an exception, never NaN or Infinity in a file.

Each key is set alone to its maximum and to its smallest accepted value on four composed
specs (the CPU tiny default, the CPU MoE preset, a 64-GPU Llama 3 70B, DeepSeek-V3 with MLA
and MoE); each spec is composed once by Hydra, then edited as data, so the sweep stays fast.
"""

from __future__ import annotations

import copy
import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from lmspec.compiler.emit import emit_all
from lmspec.compiler.errors import SpecError
from lmspec.compiler.pipeline import plan_from
from lmspec.compiler.spec.load import Composed, compose_spec
from lmspec.compiler.spec.schema import spec_schema

SMALLEST_ABOVE_ZERO = 1e-300


def _numeric_leaves(node: dict[str, Any], path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], dict]]:
    out = []
    for name, prop in node.get("properties", {}).items():
        for option in [prop, *prop.get("anyOf", [])]:
            if option.get("type") == "object":
                out += _numeric_leaves(option, (*path, name))
            elif option.get("type") in ("integer", "number") and "enum" not in option:
                out.append(((*path, name), option))
    return out


def _edges(schema: dict[str, Any]) -> list[int | float]:
    low = schema.get("minimum", SMALLEST_ABOVE_ZERO if "exclusiveMinimum" in schema else None)
    if schema["type"] == "integer" and low is not None:
        low = int(low) + (1 if "exclusiveMinimum" in schema else 0)
    return [v for v in (schema["maximum"], low) if v is not None]


LEAVES = _numeric_leaves(spec_schema())
BASES = {
    "tiny-cpu": (None, []),
    "tiny-moe": ("tiny_moe_pretrain_2rank_cpu_fp32", []),
    "llama3-70b": ("llama3_70b_pretrain_64gpu_h100_bf16", []),
    "deepseek-v3": ("deepseek_v3_pretrain_2048gpu_h800_bf16", []),
}


@cache
def _composed(base: str) -> Composed:
    spec, overrides = BASES[base]
    return compose_spec(list(overrides), Path(spec) if spec else None)


def _set(data: dict[str, Any], path: tuple[str, ...], value: object) -> bool:
    for part in path[:-1]:
        data = data.get(part)
        if not isinstance(data, dict):
            return False  # an optional section (model.moe, model.mla) this base does not have
    data[path[-1]] = value
    return True


def _refuse(constant: str) -> None:
    raise AssertionError(f"non-standard JSON constant {constant}")


def _has_section(base: str, path: tuple[str, ...]) -> bool:
    """Whether `base` has the section holding `path` (model.moe and model.mla are optional)."""
    data: Any = _composed(base).spec
    for part in path[:-1]:
        data = data.get(part) if isinstance(data, dict) else None
    return isinstance(data, dict)


CASES = [
    pytest.param(base, path, value, id=f"{base}-{'.'.join(path)}={value}")
    for base in BASES
    for path, schema in LEAVES
    if _has_section(base, path)
    for value in _edges(schema)
]


def test_every_numeric_key_is_swept() -> None:
    assert len(LEAVES) > 60 and len(CASES) > 200


@pytest.mark.parametrize(("base", "path", "value"), CASES)
def test_a_number_at_its_edge_is_refused_or_compiles_to_standard_json(
    base: str, path: tuple[str, ...], value: int | float
) -> None:
    composed = _composed(base)
    spec = copy.deepcopy(composed.spec)
    assert _set(spec, path, value)
    edited = Composed(spec=spec, origins=composed.origins, overrides=composed.overrides, choices=composed.choices)
    try:
        files = emit_all(plan_from(edited))
    except SpecError as exc:
        assert exc.problems and all(p.key and p.message for p in exc.problems)
        return
    for name, text in files.items():
        if name.endswith(".json"):
            json.loads(text, parse_constant=_refuse)
