"""Every YAML file a compose reads: read and parsed once by libyaml, checked, then shared.

OmegaConf's own loader (what Hydra calls on each file) accepts what a spec must not:

- it expands every alias while building its nodes, so a "billion laughs" file never finishes;
- it constructs every standard tag: `!!binary` gives bytes, `!!set` a set, `!!timestamp` a
  date, each failing later far from the file (or with a traceback);
- it reads YAML 1.1 numbers nobody means: `master_port: 8:20` is base 60 (500), `010` octal (8);
- it recurses once per nesting level (a RecursionError at a few hundred levels);
- a non-UTF-8 file, a scalar file, `defaults: 5` or `defaults: [5]` end in a traceback.

Here each file is read as UTF-8 and composed by libyaml with OmegaConf's own implicit
resolvers (so every node carries the tag OmegaConf would construct), checked in one walk
that visits each node once (aliases are counted, never expanded), and constructed; Hydra
gets `OmegaConf.create` of that value (compiler/spec/hydra_compat.py) and provenance reads the same nodes
for its `file:line`s. One parse per file instead of OmegaConf's pure-Python one plus a
libyaml one for provenance.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from omegaconf._utils import get_yaml_loader

from lmspec.compiler.errors import Problem, SpecError, UsageError, error
from lmspec.compiler.paths import display_path

# A spec file is a few KB; these bounds are far above any real one and far below trouble.
MAX_FILE_BYTES = 1 << 20
MAX_DEPTH = 32  # nesting levels (the deepest shipped spec has 4)
MAX_ALIAS_NODES = 1_000  # values that aliases may add when expanded

_BASE = "tag:yaml.org,2002:"
PLAIN_TAGS = frozenset(f"{_BASE}{kind}" for kind in ("str", "int", "float", "bool", "null", "seq", "map"))
KEY_TAGS = frozenset(f"{_BASE}{kind}" for kind in ("str", "int", "float", "bool", "merge"))
MERGE_TAG = f"{_BASE}merge"  # `<<: *anchor` keys: plain YAML, OmegaConf merges them
_TYPED = frozenset(f"{_BASE}{kind}" for kind in ("int", "float", "bool", "null"))
_OCTAL = re.compile(r"[-+]?0[0-7_]+")

_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class SpecLoader(_Loader):
    """libyaml's safe loader (10x the pure-Python one) with OmegaConf's implicit resolvers:
    its float forms (`1e-3`), no timestamps. The tags of the nodes are what OmegaConf builds."""


SpecLoader.yaml_implicit_resolvers = {
    key: list(resolvers) for key, resolvers in get_yaml_loader().yaml_implicit_resolvers.items()
}


@dataclass(frozen=True)
class YamlFile:
    """One YAML file as read: its text, libyaml's node tree (line marks) and its value."""

    path: Path
    text: str
    node: yaml.Node | None
    data: dict[str, Any] | None


def _where(path: Path, mark: Any) -> str:
    return f"{display_path(path)}:{mark.line + 1}" if mark is not None else display_path(path)


def _tag_name(tag: str) -> str:
    return "!!" + tag.removeprefix(_BASE) if tag.startswith(_BASE) else tag


def _base60(text: str) -> int | float:
    sign = -1 if text.startswith("-") else 1
    value: int | float = 0
    for part in text.lstrip("+-").replace("_", "").split(":"):
        value = value * 60 + (float(part) if "." in part else int(part))
    return sign * value


def _number_problem(node: yaml.ScalarNode) -> str | None:
    """A YAML 1.1 number that reads as something else than it looks like, or None."""
    text = node.value
    if node.tag in (f"{_BASE}int", f"{_BASE}float") and ":" in text:
        value = _base60(text)
        return f'{text} is a YAML 1.1 base-60 number ({value}); quote it ("{text}") or write {value}'
    if node.tag == f"{_BASE}int" and _OCTAL.fullmatch(text):
        value = int(text.replace("_", ""), 8)
        return f'{text} is a YAML 1.1 octal number ({value}); quote it ("{text}") or write {value}'
    return None


@dataclass
class _Walk:
    """One pass over a node graph: each distinct node checked once, expanded sizes counted."""

    path: Path
    loader: Any
    problems: list[Problem] = field(default_factory=list)
    sizes: dict[int, int] = field(default_factory=dict)  # id(node) -> values it expands to
    open: set[int] = field(default_factory=set)  # nodes on the current path (an alias loop)

    def fail(self, node: yaml.Node, key: str, text: str) -> None:
        subject = f"{key}: " if key else ""
        self.problems.append(error("<file>", f"{_where(self.path, node.start_mark)}: {subject}{text}"))

    def size(self, node: yaml.Node, key: str, depth: int) -> int:
        known = self.sizes.get(id(node))
        if known is not None:
            return known
        if id(node) in self.open:
            self.fail(node, key, "a YAML alias refers to the value that contains it; write the value out")
            return 1
        if depth > MAX_DEPTH:
            self.fail(node, key, f"nested deeper than {MAX_DEPTH} levels; a spec nests a few")
            return 1
        self.open.add(id(node))
        total = 1 + sum(self.size(child, child_key, depth + 1) for child_key, child in self.children(node, key))
        self.open.discard(id(node))
        self.sizes[id(node)] = total
        return total

    def children(self, node: yaml.Node, key: str) -> list[tuple[str, yaml.Node]]:
        if node.tag not in PLAIN_TAGS:
            self.fail(node, key, f"the YAML tag {_tag_name(node.tag)} is not allowed in a spec; write a plain value")
            return []
        if isinstance(node, yaml.ScalarNode):
            if node.tag in _TYPED and self.loader.resolve(yaml.ScalarNode, node.value, (True, False)) != node.tag:
                self.fail(node, key, f"{node.value!r} is not a {_tag_name(node.tag)}; drop the tag or fix the value")
            problem = _number_problem(node)
            if problem:
                self.fail(node, key, problem)
            return []
        if isinstance(node, yaml.SequenceNode):
            return [(f"{key}[{i}]", item) for i, item in enumerate(node.value)]
        out: list[tuple[str, yaml.Node]] = []
        first: dict[str, yaml.Node] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag not in KEY_TAGS:
                self.fail(key_node, key, "a key must be a plain word")
                continue
            child = f"{key}.{key_node.value}" if key else str(key_node.value)
            if key_node.tag != MERGE_TAG:
                if key_node.value in first:
                    line = first[key_node.value].start_mark.line + 1
                    self.fail(key_node, child, f"duplicate key (first set on line {line}); keep one of them")
                first[key_node.value] = key_node
            out.append((child, value_node))
        return out


def _defaults_problems(path: Path, root: yaml.MappingNode) -> list[Problem]:
    """The shape Hydra's defaults list needs, checked here so that a wrong one is a message."""
    node = next((v for k, v in root.value if isinstance(k, yaml.ScalarNode) and k.value == "defaults"), None)
    if node is None:
        return []
    form = "items look like `- config`, `- model: tiny`, `- override hardware: h100_80g` or `- _self_`"

    def problem(at: yaml.Node, key: str, text: str) -> Problem:
        return error("<file>", f"{_where(path, at.start_mark)}: {key}: {text}; {form}")

    def is_name(n: yaml.Node) -> bool:  # an interpolation `${...}` too is refused: it names no preset
        return isinstance(n, yaml.ScalarNode) and n.tag == f"{_BASE}str" and n.value != "" and "${" not in n.value

    if not isinstance(node, yaml.SequenceNode):
        shown = node.value if isinstance(node, yaml.ScalarNode) else "a mapping"
        return [problem(node, "defaults", f"must be a list, not {shown or 'empty'}")]
    problems = []
    self_line = override_line = 0
    for i, item in enumerate(node.value):
        key = f"defaults[{i}]"
        is_override = isinstance(item, yaml.MappingNode) and any(
            isinstance(k, yaml.ScalarNode) and "override" in str(k.value).split()[:-1] for k, _ in item.value
        )
        if is_override and not override_line:
            override_line = item.start_mark.line + 1
        elif override_line and not is_override and not (isinstance(item, yaml.ScalarNode) and item.value == "_self_"):
            problems.append(
                problem(item, key, f"comes after the override on line {override_line}: overrides go at the end")
            )
            continue
        if isinstance(item, yaml.ScalarNode):
            if not is_name(item):
                problems.append(problem(item, key, f"{item.value or 'an empty value'} is not a config name"))
            elif item.value == "_self_" and self_line:
                problems.append(problem(item, key, f"a second _self_ (the first is on line {self_line}); keep one"))
            elif item.value == "_self_":
                self_line = item.start_mark.line + 1
        elif isinstance(item, yaml.MappingNode) and len(item.value) == 1:
            group, choice = item.value[0]
            ok = is_name(group) and (
                is_name(choice)
                or choice.tag == f"{_BASE}null"
                or (isinstance(choice, yaml.SequenceNode) and all(is_name(c) for c in choice.value))
            )
            if not ok:
                problems.append(problem(item, key, "a group's choice must be a config name, a list of them or null"))
        else:
            problems.append(problem(item, key, "one entry names one config or one group"))
    return problems


def _yaml_error(path: Path, text: str, exc: yaml.YAMLError) -> Problem:
    """libyaml's error as `file:line:column: YAML syntax error: what; fix`, one line."""
    if isinstance(exc, yaml.reader.ReaderError):  # a character YAML refuses; it has a position, no mark
        line = text.count("\n", 0, exc.position) + 1
        return error(
            "<file>",
            f"{display_path(path)}:{line}: YAML syntax error: character #x{exc.character:04x} ({exc.reason}); "
            "a spec is text: remove it",
        )
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    context = getattr(exc, "context", None)
    where = f"{display_path(path)}:{mark.line + 1}:{mark.column + 1}" if mark is not None else display_path(path)
    said = " ".join((f"{context}, {problem}" if context else str(problem)).split())
    lines = text.splitlines()
    line_text = lines[mark.line] if mark is not None and mark.line < len(lines) else ""
    hint = "YAML indents with spaces, not tabs" if "\t" in line_text else "fix the file"
    return error("<file>", f"{where}: YAML syntax error: {said}; {hint}")


def _decode(path: Path, raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise SpecError(
            [
                error(
                    "<file>",
                    f"{display_path(path)}:{line}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start}); "
                    "a spec is a UTF-8 YAML file: save it as UTF-8",
                )
            ]
        ) from None


def parse_yaml(path: Path, raw: bytes, *, primary: bool = False) -> YamlFile:
    """Check and parse one spec or group file's bytes; SpecError naming file:line otherwise."""
    text = _decode(path, raw)
    loader = SpecLoader(text)
    try:
        node = loader.get_single_node()
        problems: list[Problem] = []
        if node is None:
            if primary:
                problems.append(
                    error("<file>", f"{display_path(path)}: empty; a spec holds `defaults:` and `name:` at least")
                )
        elif not isinstance(node, yaml.MappingNode):
            kind = "a list" if isinstance(node, yaml.SequenceNode) else f"the single value {node.value[:40]!r}"
            problems.append(
                error(
                    "<file>",
                    f"{_where(path, node.start_mark)}: holds {kind}; a spec or group file is a mapping of keys "
                    "(`name: ...`, `defaults: [...]`)",
                )
            )
        else:
            walk = _Walk(path, loader)
            expanded = walk.size(node, "", 0)
            if not walk.problems and expanded - len(walk.sizes) > MAX_ALIAS_NODES:
                problems.append(
                    error(
                        "<file>",
                        f"{display_path(path)}: its YAML aliases expand to {expanded} values (more than "
                        f"{MAX_ALIAS_NODES} added); write the values out or use fewer aliases",
                    )
                )
            problems.extend(walk.problems)
            for key_node, _ in node.value:
                if isinstance(key_node, yaml.ScalarNode) and key_node.value == "hydra":
                    problems.append(
                        error(
                            "<file>",
                            f"{_where(path, key_node.start_mark)}: hydra: Hydra's own settings have no effect in "
                            "lmspec, which only composes specs (it sets the search path itself); remove the section",
                        )
                    )
            if not problems:
                problems.extend(_defaults_problems(path, node))
        if problems:
            raise SpecError(problems)
        data = loader.construct_document(node) if node is not None else None  # every tag is plain: cannot fail
    except yaml.YAMLError as exc:
        raise SpecError([_yaml_error(path, text, exc)]) from None
    finally:
        loader.dispose()
    return YamlFile(path=path, text=text, node=node, data=data)


class YamlFiles:
    """The YAML files one compose reads, each read, checked and parsed once."""

    def __init__(self) -> None:
        self._files: dict[Path, YamlFile] = {}

    def read(self, path: Path, *, primary: bool = False) -> YamlFile:
        key = path.resolve()
        if key not in self._files:
            self._files[key] = parse_yaml(path, read_spec_bytes(path), primary=primary)
        return self._files[key]


def read_spec_bytes(path: Path) -> bytes:
    """A spec file's bytes: a regular file of at most MAX_FILE_BYTES, else a UsageError."""
    try:
        if path.is_dir():
            raise UsageError(f"{display_path(path)}: a directory, not a spec file; give a .yaml file")
        if not path.is_file():  # a FIFO or a device would block or never end
            raise UsageError(f"{display_path(path)}: not a regular file; give a .yaml file")
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise UsageError(f"{display_path(path)}: {size} bytes; a spec file is at most {MAX_FILE_BYTES} bytes")
        return path.read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read {display_path(path)}: {exc.strerror}") from None
