"""`${...}` interpolations, checked before OmegaConf resolves them: a spec whose references would copy
past MAX_RESOLVED_VALUES values is refused, and a reference that fails is reported at the key the user
set (the override as typed, or file:line), not at the key that uses the value."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from hydra.core.override_parser.types import Override
from omegaconf.errors import OmegaConfBaseException

from lmspec.compiler.errors import Problem, SpecError, error
from lmspec.compiler.spec.overrides import nullable_sections
from lmspec.compiler.spec.provenance import COMMAND_LINE, Origins
from lmspec.compiler.spec.rephrase import omegaconf_detail
from lmspec.compiler.spec.suggest import did_you_mean, known_keys

MAX_RESOLVED_VALUES = 10_000  # values of a resolved spec; the largest shipped preset has 134
_REFERENCE = re.compile(r"\$\{\s*(\.*[A-Za-z_][\w\-]*(?:\.[A-Za-z_][\w\-]*)*)\s*\}")
_ABSENT = object()


def _raw_at(tree: Any, dotted: str) -> Any:
    node = tree
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return _ABSENT
        node = node[part]
    return node


def _is_mapping(raw: Any, dotted: str) -> bool:
    return isinstance(_raw_at(raw, dotted), dict)


def _absolute(holder: str, reference: str) -> str:
    """OmegaConf's relative `${.x}` (a sibling) and `${..x}` (the parent's sibling), made absolute."""
    dots = len(reference) - len(reference.lstrip("."))
    if dots == 0:
        return reference
    return ".".join([*holder.split(".")[:-dots], reference[dots:]])


@dataclass(frozen=True)
class _Broken:
    holder: str  # the key whose value holds the `${...}` that fails
    written: str  # that `${...}` as written
    reference: str | None  # the key it names, absolute
    why: str  # "missing", "loop" or "other"


def _broken_reference(raw: Any, start: str) -> _Broken:
    """The `${...}` that fails, following the chain of interpolations from the key OmegaConf failed on."""
    deepest = start

    def visit(key: str, seen: frozenset[str]) -> _Broken | None:
        nonlocal deepest
        value = _raw_at(raw, key)
        if not isinstance(value, str) or "${" not in value:
            return None
        deepest = key
        for match in _REFERENCE.finditer(value):
            reference = _absolute(key, match.group(1))
            if reference in seen or reference == key:
                return _Broken(key, match.group(0), reference, "loop")
            target = _raw_at(raw, reference)
            if target is _ABSENT or target == "???":
                return _Broken(key, match.group(0), reference, "missing")
            found = visit(reference, seen | {key})
            if found is not None:
                return found
        return None

    found = visit(start, frozenset())
    if found is not None:
        return found
    value = _raw_at(raw, deepest)
    return _Broken(deepest, value if isinstance(value, str) else "", None, "other")


def refuse_expansion(raw: Any, parsed: list[Override], origins: Origins) -> None:
    """Interpolations copy what they name: `${a}` nine times in b, b nine times in c... resolve
    to 9**n values (OmegaConf builds every one). Counted here through the references, each key
    once, and refused beyond MAX_RESOLVED_VALUES before OmegaConf resolves anything."""
    sizes: dict[str, int] = {}
    added: dict[str, int] = {}  # holder key -> values its references bring in

    def of_key(key: str, stack: frozenset[str]) -> int:
        if key not in sizes:
            target = _raw_at(raw, key)
            if key in stack or target is _ABSENT:
                return 1  # a loop or a missing key: OmegaConf's own error says which
            sizes[key] = of_value(target, key, stack | {key})
        return sizes[key]

    def of_value(value: Any, key: str, stack: frozenset[str]) -> int:
        if isinstance(value, dict):
            return 1 + sum(of_key(f"{key}.{k}" if key else str(k), stack) for k in value)
        if isinstance(value, list):
            return 1 + sum(of_value(item, key, stack) for item in value)
        if isinstance(value, str) and "${" in value:
            brought = sum(of_key(_absolute(key, m.group(1)), stack) for m in _REFERENCE.finditer(value))
            added[key] = added.get(key, 0) + brought
            return 1 + brought
        return 1

    total = of_value(raw, "", frozenset())
    if total > MAX_RESOLVED_VALUES:
        holder = max(added, key=lambda k: added[k])
        raise SpecError(
            [
                error(
                    holder,
                    f"{_said(holder, parsed, origins)}: its interpolations copy {added[holder]} values and the "
                    f"spec would resolve to {total} (a spec resolves to a few hundred; at most "
                    f"{MAX_RESOLVED_VALUES}); refer to fewer or smaller sections",
                )
            ]
        )


def _said(key: str, parsed: list[Override], origins: Origins) -> str:
    """How the user set `key`: the override as typed, or the key and its file:line."""
    if origins.of(key) == COMMAND_LINE:
        typed = next((o for o in reversed(parsed) if o.key_or_group == key), None)
        if typed is not None:
            return f"{typed.input_line!r} (command-line override)"
    return f"{key} ({origins.of(key)})"


def interpolation_problem(raw: Any, exc: OmegaConfBaseException, parsed: list[Override], origins: Origins) -> Problem:
    """One problem naming the key the user set (the override as typed, or file:line) whose
    `${...}` fails, or the key it names when that one is missing; not the key using the value."""
    broken = _broken_reference(raw, str(exc.full_key or ""))
    said = _said(broken.holder, parsed, origins)
    reference = broken.reference
    if broken.why == "missing" and reference is not None:
        parts = reference.split(".")
        prefixes = [".".join(parts[: i + 1]) for i in range(len(parts))]
        flat = next((p for p in prefixes[:-1] if _raw_at(raw, p) is not _ABSENT and not _is_mapping(raw, p)), None)
        if flat is not None and _raw_at(raw, flat) is None and flat in nullable_sections():
            return error(
                broken.holder,
                f"{said} reads {reference} through {broken.written}, but {_said(flat, parsed, origins)} is "
                f"null: set {broken.holder} to a value of its own",
            )
        if flat is not None:  # e.g. `train: 5` replaced the section the reference reads from
            return error(
                flat,
                f"{_said(flat, parsed, origins)} is {json.dumps(_raw_at(raw, flat))}, not a mapping, so "
                f"{said} finds no {reference} for {broken.written}; {flat} must be a mapping of keys",
            )
        absent = next((p for p in prefixes if _raw_at(raw, p) in (_ABSENT, "???")), reference)
        if absent in known_keys():
            removed = next((o for o in parsed if o.is_delete() and o.key_or_group == absent), None)
            by = f" (removed by {removed.input_line!r})" if removed is not None else ""
            return error(
                absent,
                f"{absent}: missing{by}; {said} uses it as {broken.written}: set {absent} in the spec "
                f"or with {'' if removed is not None else '+'}{absent}=...",
            )
        hint = did_you_mean(reference, known_keys())
        return error(broken.holder, f"{said}: {broken.written} names no key{hint}")
    if broken.why == "loop":
        return error(broken.holder, f"{said}: {broken.written} refers back to itself; give one of them a plain value")
    shown = f" {broken.written!r}" if broken.written else ""
    return error(broken.holder, f"{said}: cannot resolve{shown}: {omegaconf_detail(exc, with_key=False)}")
