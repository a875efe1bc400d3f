"""Hydra's defaults lists, as lmspec hooks into their composition (compiler/spec/hydra_compat.py is the
one seam): every file read once and kept for provenance, the primary spec's list completed with lmspec's
own choice for each group it leaves out, include loops refused with the files of the loop, a missing
config named by the defaults entry (file:line) or override that asked for it, and the list Hydra built
kept for provenance's replay."""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from hydra.core.default_element import DefaultsTreeNode, GroupDefault, InputDefault, ResultDefault
from hydra.core.override_parser.types import Override
from hydra.errors import MissingConfigException

from lmspec.compiler.build.files import SPEC
from lmspec.compiler.errors import Problem, SpecError, error
from lmspec.compiler.paths import SPECS_DIR, display_path
from lmspec.compiler.spec import hydra_compat
from lmspec.compiler.spec.suggest import did_you_mean
from lmspec.compiler.spec.yaml_files import YamlFile, YamlFiles

DEFAULT_CONFIG = "config"  # specs/config.yaml: the default spec and its defaults list
MAX_DEFAULTS_DEPTH = 32  # files including files; the shipped specs nest 2 deep


@dataclass
class Reads:
    """What one composition read: each config path's file, and the defaults list it built."""

    files: YamlFiles
    parsed: list[Override]
    by_config: dict[str, YamlFile] = field(default_factory=dict)
    defaults: list[list[ResultDefault]] = field(default_factory=list)


def _tree_path(node: InputDefault) -> str | None:
    """The config path a defaults-tree node names, or None (the virtual root, a group's list, unset)."""
    if node.is_virtual() or (isinstance(node, GroupDefault) and (node.is_options() or node.get_name() is None)):
        return None
    try:
        return node.get_config_path()
    except AssertionError:  # not placed in the tree yet (the primary config before its first visit)
        return None


def _shown_config(path: str, reads: Reads) -> str:
    read = reads.by_config.get(path)
    return display_path(read.path) if read is not None else path


def _refuse_cycle(root: DefaultsTreeNode, reads: Reads) -> None:
    path = _tree_path(root.node)
    if path is None:
        return
    chain = [path]
    up = root.parent
    while up is not None:
        above = _tree_path(up.node)
        if above is not None:
            chain.append(above)
            if above == path:
                loop = " -> ".join(reversed(chain))
                hint = ""
                read = reads.by_config.get(path)
                builtin = SPECS_DIR / f"{path}.yaml"
                if read is not None and builtin.is_file() and read.path.resolve() != builtin.resolve():
                    hint = (
                        f"; to build on lmspec's own {path}, rename {read.path.name} "
                        "(a spec's directory is searched before lmspec's specs/)"
                    )
                raise SpecError(
                    [
                        error(
                            "<defaults>",
                            f"{_shown_config(path, reads)}: its defaults list includes itself ({loop}); "
                            f"remove that entry{hint}",
                        )
                    ]
                )
        up = up.parent
    if len(chain) > MAX_DEFAULTS_DEPTH:
        raise SpecError(
            [error("<defaults>", f"{_shown_config(path, reads)}: defaults lists nest deeper than {MAX_DEFAULTS_DEPTH}")]
        )


def _defaults_items(read: YamlFile) -> list[Any]:
    node = read.node
    if not isinstance(node, yaml.MappingNode):
        return []
    items = next((v for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == "defaults"), None)
    return items.value if isinstance(items, yaml.SequenceNode) else []


def _defaults_entry(reads: Reads, parent: str | None, group: str | None, name: str | None) -> str:
    """` (file:line)` of the defaults entry that asks for `name` (of `group`): in the parent
    config's file, else an `override` entry in any file read; ` (file)` of the parent, or ""."""
    files = [reads.by_config[parent]] if parent in reads.by_config else []
    files += [read for path, read in reads.by_config.items() if path != parent]
    for read in files:
        for item in _defaults_items(read):
            if isinstance(item, yaml.ScalarNode) and group is None and item.value == name:
                return f" ({display_path(read.path)}:{item.start_mark.line + 1})"
            if not (isinstance(item, yaml.MappingNode) and len(item.value) == 1) or group is None:
                continue
            key, choice = item.value[0]
            words = str(key.value).split()
            choices = choice.value if isinstance(choice, yaml.SequenceNode) else [choice]
            named = words and words[-1].split("@")[0].lstrip("/") == group.rpartition("/")[2]
            from_here = read is files[0] and parent in reads.by_config
            if named and (from_here or "override" in words) and any(c.value == name for c in choices):
                return f" ({display_path(read.path)}:{choice.start_mark.line + 1})"
    return f" ({display_path(files[0].path)})" if parent in reads.by_config else ""


def _missing_config(exc: MissingConfigException, tree: DefaultsTreeNode, reads: Reads, searched: list[str]) -> Problem:
    element = tree.node
    missing = exc.missing_cfg_file or str(element)
    parent = tree.parent.node if tree.parent is not None else None
    parent_path = _tree_path(parent) if parent is not None else None
    if isinstance(element, GroupDefault):
        group, name = element.get_group_path(), element.get_name()
        typed = next(
            (o for o in reads.parsed if o.key_or_group == group and not o.is_delete() and o.value() == name), None
        )
        where = (
            f" ({typed.input_line}, command-line override)"
            if typed is not None
            else _defaults_entry(reads, parent_path, group, name)
        )
        options = list(exc.options or [])
        hint = did_you_mean(name or "", options) if options else ""
        listed = f"; {group} has: {', '.join(options)}" if options else f"; there is no group {group}"
        return error(group, f"{missing}: no such config{where}{listed}{hint}")
    where = _defaults_entry(reads, parent_path, None, getattr(element, "path", None))
    looked = [display_path(Path(path)) for path in searched]
    return error(
        "<defaults>",
        f"{missing}: no such config{where}; looked for {missing}.yaml in {', '.join(looked)}",
    )


def _group_named(entry: Any) -> str | None:
    """The group a defaults-list entry chooses (`- model: x`, `- override /hardware@hw: y`), or None."""
    if not (isinstance(entry, dict) and len(entry) == 1):
        return None
    return str(next(iter(entry))).split()[-1].split("@")[0].lstrip("/")


def completed_defaults(entries: list[Any]) -> list[Any]:
    """A spec's defaults list with lmspec's own choice for each group it leaves out (a spec states
    only what differs), in the built-in config's order: hardware after train and serve, which the
    cpu preset sizes; all before the spec's own values (`_self_`, last where the list does not say),
    which then override them. A list that includes another config (`- config`, a team's base spec)
    leaves the choices to it."""
    if any(isinstance(e, str) and e != "_self_" for e in entries):
        return entries
    config = YamlFiles().read(SPECS_DIR / f"{DEFAULT_CONFIG}.yaml").data
    assert config is not None, "lmspec's specs/config.yaml holds the built-in defaults list"
    builtin = [e for e in config["defaults"] if e != "_self_"]
    order = [_group_named(e) for e in builtin]
    done = list(entries) if "_self_" in entries else [*entries, "_self_"]
    present = {_group_named(e) for e in done}
    for rank, entry in enumerate(builtin):
        if order[rank] in present:
            continue
        later = set(order[rank + 1 :])
        at = next((i for i, e in enumerate(done) if _group_named(e) in later or e == "_self_"), len(done))
        done.insert(at, entry)
    return done


def literal_strings(data: Any) -> Any:
    """`data` with `${` escaped in every string, so OmegaConf takes each string as the text it is."""
    if isinstance(data, dict):
        return {key: literal_strings(value) for key, value in data.items()}
    if isinstance(data, list):
        return [literal_strings(item) for item in data]
    return data.replace("${", "\\${") if isinstance(data, str) else data


def hooks(reads: Reads, primary: Path | None) -> AbstractContextManager[None]:
    """Hydra hooked for one composition (compiler/spec/hydra_compat.py):

    - every file a file config source loads is read through `files` (compiler/spec/yaml_files.py):
      checked, parsed once by libyaml, shared with provenance; the `primary` spec file's defaults
      list gets lmspec's choice for each group it leaves out (`completed_defaults`); a build's
      spec.resolved.yaml as `primary` has every `${` escaped (`literal_strings`): its values were
      resolved already, so a `${` in one is text an override escaped (`\\${name}`), not a reference;
    - the defaults tree refuses a config that includes itself (Hydra recurses until Python's
      stack ends) and names the files of the loop;
    - a config Hydra cannot find is reported with Hydra's own attributes (its group, the
      options it found), not its text of tabs and search-path providers;
    - the defaults list Hydra builds is caught: `compose` computes it but does not return it,
      and asking `compute_defaults_list` again would reload every file.
    """

    def read(config_path: str, path: Path) -> tuple[dict[str, Any] | None, str]:
        read = reads.files.read(path)
        reads.by_config[config_path] = read
        if path == primary and isinstance(read.data, dict):
            data = literal_strings(read.data) if path.name == SPEC else read.data
            return {**data, "defaults": completed_defaults(list(data.get("defaults") or []))}, read.text
        return read.data, read.text

    def missing(exc: MissingConfigException, tree: DefaultsTreeNode, searched: list[str]) -> Exception:
        return SpecError([_missing_config(exc, tree, reads, searched)])

    return hydra_compat.composition_hooks(read, lambda root: _refuse_cycle(root, reads), missing, reads.defaults.append)
