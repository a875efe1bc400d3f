"""Kubernetes objects as the multi-document YAML `kubectl apply -f` reads: plain dicts through PyYAML's safe
dumper, keys sorted (deterministic output), with two choices of style:

- a string of several lines (a ConfigMap's file, a script) is a literal block (`|`), so a reviewer reads the
  file as it is; PyYAML falls back to a quoted scalar where a block cannot hold it exactly (trailing spaces,
  control characters), so every string loads back byte for byte;
- y, Y, n and N are quoted: PyYAML reads them as strings and would write them bare, but kubectl's YAML reader
  (go-yaml, YAML 1.1) reads them as booleans, and an env value or label of `y` would be refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import yaml

GO_YAML_BOOLEANS = frozenset(("y", "Y", "n", "N"))  # YAML 1.1 booleans PyYAML's resolver leaves as strings
LINE_WIDTH = 1 << 16  # never fold a long string: a manifest's lines are read by people and by diff


class _Dumper(yaml.SafeDumper):
    """The safe dumper with `_string`'s styles."""


def _string(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else '"' if value in GO_YAML_BOOLEANS else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _string)


def dump_objects(objects: Sequence[dict[str, Any]]) -> str:
    """The objects as one YAML stream, each document starting with `---`."""
    return yaml.dump_all(
        objects, Dumper=_Dumper, sort_keys=True, explicit_start=True, allow_unicode=True, width=LINE_WIDTH
    )
