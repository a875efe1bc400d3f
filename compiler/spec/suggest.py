"""The nearest name to a misspelt one, for "did you mean" in messages, and every dotted key of the spec
(the names an unknown key is measured against). Shared by composition's messages and the schema check.
"""

from __future__ import annotations

from typing import Any


def did_you_mean(word: str, candidates: list[str]) -> str:
    """`; did you mean X?` with the closest candidate (difflib), or "" when none is close."""
    import difflib  # only on the error path

    close = difflib.get_close_matches(word, candidates, n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""


def known_keys() -> list[str]:
    """Every dotted key of the spec (`train.optimizer.lr`), sections included, from its schema."""
    from lmspec.compiler.spec.schema import spec_schema

    keys: list[str] = []

    def walk(node: dict[str, Any], prefix: str) -> None:
        for name, prop in node.get("properties", {}).items():
            dotted = f"{prefix}{name}"
            keys.append(dotted)
            for option in [prop, *prop.get("anyOf", [])]:
                walk(option, dotted + ".")

    walk(spec_schema(), "")
    return keys
