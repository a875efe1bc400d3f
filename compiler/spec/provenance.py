"""Where each leaf of the resolved spec came from: `file:line` or `command-line override`.

Hydra does not track lines, but its config loader tells the ordered sources it
merges (`compute_defaults_list`). Replaying that order over the line-aware node
tree of each source (libyaml's, parsed once for the whole compose by
compiler/spec/yaml_files.py; last writer wins), then the command-line overrides, gives
the origin of every leaf.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import yaml

from lmspec.compiler.paths import display_path
from lmspec.compiler.spec.yaml_files import YamlFile

COMMAND_LINE = "command-line override"


def _key_lines(node: yaml.Node, prefix: str, out: dict[str, tuple[int, bool]]) -> None:
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            child = f"{prefix}.{key_node.value}" if prefix else str(key_node.value)
            if child == "defaults":
                continue
            is_leaf = not isinstance(value_node, yaml.MappingNode)
            out[child] = (key_node.start_mark.line + 1, is_leaf)
            _key_lines(value_node, child, out)


def yaml_key_lines(node: yaml.Node | None, package: str) -> dict[str, tuple[int, bool]]:
    """Dotted key -> (1-based line, is a leaf) for every key of a YAML node tree placed at `package`."""
    lines: dict[str, tuple[int, bool]] = {}
    if node is not None:
        _key_lines(node, package, lines)
    return lines


@dataclass
class Origins:
    """Dotted key -> origin string, with lookup falling back to the nearest parent."""

    where: dict[str, str] = field(default_factory=dict)

    def of(self, key: str) -> str:
        probe = key
        while probe:
            if probe in self.where:
                return self.where[probe]
            probe = probe.rpartition(".")[0]
        return "default"

    def add_file(self, source: YamlFile, package: str) -> None:
        shown = display_path(source.path)
        for key, (line, is_leaf) in yaml_key_lines(source.node, package).items():
            if is_leaf:  # a leaf (null, scalar, list) replaces whatever was below it
                self._forget_below(key)
                self.where[key] = f"{shown}:{line}"
            else:  # a mapping merges: it only names the section where nothing finer is known
                self.where.setdefault(key, f"{shown}:{line}")

    def add_override(self, key: str) -> None:
        self._forget_below(key)
        self.where[key] = COMMAND_LINE

    def _forget_below(self, key: str) -> None:
        for stale in [k for k in self.where if k.startswith(key + ".")]:
            del self.where[stale]


def replay(sources: Iterable[tuple[YamlFile, str]], override_keys: Iterable[str]) -> Origins:
    """Origins from sources in merge order, then the value overrides from the command line."""
    origins = Origins()
    for source, package in sources:
        origins.add_file(source, package)
    for key in override_keys:
        origins.add_override(key)
    return origins
