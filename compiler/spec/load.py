"""Compose a spec with Hydra: built-in groups, a user's own spec file, command-line overrides.

Returns the resolved spec as a plain dict plus where every leaf came from. Hydra's
own exceptions are re-phrased here into problems that name the key and the fix.
"""

from __future__ import annotations

import json
import re
import typing
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import yaml
from hydra import compose, initialize_config_dir
from hydra.core.default_element import DefaultsTreeNode, GroupDefault, InputDefault, ResultDefault
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import GrammarParseError, InterpolationResolutionError, OmegaConfBaseException

from lmspec.compiler.errors import Problem, SpecError, UsageError, error
from lmspec.compiler.paths import SPECS_DIR, display_path
from lmspec.compiler.spec import hydra_compat
from lmspec.compiler.spec.provenance import COMMAND_LINE, Origins, replay
from lmspec.compiler.spec.sections import Spec
from lmspec.compiler.spec.yaml_files import YamlFile, YamlFiles

DEFAULT_CONFIG = "config"
MAX_DEFAULTS_DEPTH = 32  # files including files; the shipped specs nest 2 deep
MAX_RESOLVED_VALUES = 10_000  # values of a resolved spec; the largest shipped preset has 134
HYDRA_SETTINGS = (
    "Hydra's own settings have no effect in lmspec, which only composes specs (the search path is the "
    "spec's directory, then lmspec's specs/); remove it"
)
OVERRIDE_FORMS = "overrides look like key=value, group=option, +new.key=value or ~key"


@dataclass(frozen=True)
class Composed:
    """A resolved spec, where each leaf came from, and how it was asked for."""

    spec: dict[str, Any]
    origins: Origins
    overrides: tuple[str, ...]
    choices: dict[str, str]


def _search_dirs(spec_file: Path | None) -> list[Path]:
    return [spec_file.parent, SPECS_DIR] if spec_file and spec_file.parent != SPECS_DIR else [SPECS_DIR]


def _value_override_keys(parsed: list[Override], choices: dict[str, str]) -> list[str]:
    keys = []
    for override in parsed:
        key = override.key_or_group
        if override.is_hydra_override() or key in choices or override.is_delete():
            continue
        keys.append(key)
    return keys


def nullable_sections() -> tuple[str, ...]:
    """The sections a spec may set to null (train, serve, ...): `X | None` in lmspec.compiler.spec.sections."""
    hints = typing.get_type_hints(Spec)
    return tuple(name for name, hint in hints.items() if type(None) in typing.get_args(hint))


def _nulled(parsed: list[Override]) -> list[Override]:
    """`serve=null` or `~serve` for a section that may be null: the section is null, whatever files of
    the defaults list (hardware=cpu sizes serve too) put into it. lmspec sets it after Hydra composes."""
    sections = nullable_sections()
    return [
        o
        for o in parsed
        if o.key_or_group in sections and not o.is_hydra_override() and (o.is_delete() or o.value() is None)
    ]


def _hydra_overrides(spec_file: Path | None) -> list[str]:
    if spec_file is None or spec_file.parent == SPECS_DIR:  # a built-in preset: specs/ is the search path
        return []
    return [f"hydra.searchpath=['file://{SPECS_DIR}']"]


def resolve_spec_file(spec_file: Path) -> Path:
    """A path to a spec file, or the name of a built-in composed preset in specs/."""
    if spec_file.is_file():
        return spec_file.resolve()
    builtin = SPECS_DIR / f"{spec_file}.yaml"
    if spec_file.parent == Path(".") and builtin.is_file():
        return builtin
    if spec_file.exists():
        kind = "a directory" if spec_file.is_dir() else "not a regular file"
        raise UsageError(f"--spec {spec_file}: {kind}; give a spec file (.yaml) or a built-in preset name")
    presets = sorted(p.stem for p in SPECS_DIR.glob("*.yaml"))
    hint = did_you_mean(spec_file.stem.replace("-", "_"), presets) if spec_file.parent == Path(".") else ""
    raise UsageError(f"--spec {spec_file}: no such file, nor a built-in preset ({', '.join(presets)}){hint}")


def _check_spec_file(spec_file: Path, files: YamlFiles) -> None:
    if spec_file.suffix != ".yaml":  # Hydra finds a config by its name + ".yaml"
        raise UsageError(f"--spec {spec_file}: expected a .yaml file (rename it to {spec_file.stem}.yaml)")
    data = files.read(spec_file, primary=True).data
    if data and "defaults" not in data and (group := _group_of(data)) is not None:
        raise UsageError(
            f"--spec {display_path(spec_file)}: a {group} group file (its keys are {group}'s), not a whole spec; "
            f"choose it with {group}={spec_file.stem} (from a specs/{group}/ folder beside your spec, or lmspec's "
            f"own), or list it in a spec's defaults: `- {group}: {spec_file.stem}`"
        )


def _group_of(data: dict[str, Any]) -> str | None:
    """The config group whose keys are all of a file's (a model preset passed as --spec), if one is."""
    from lmspec.compiler.spec.schema import spec_schema

    sections = spec_schema()["properties"]
    keys = set(data) - {"name"}
    if not keys or keys <= set(sections):
        return None
    for group, section in sections.items():
        for option in [section, *section.get("anyOf", [])]:
            if keys <= set(option.get("properties", {})):
                return str(group)
    return None


# --- command-line overrides -------------------------------------------------------------------


def override_error(exc: OverrideParseException) -> UsageError:
    """Hydra's grammar error, naming the override (quoted) and where in it the parser stopped."""
    detail = hydra_compat.grammar_error_detail(exc)
    return UsageError(
        f"cannot parse override {exc.override!r}: {detail}; {OVERRIDE_FORMS}, and a value holding spaces or "
        "any of ()[]{},=:'\" is quoted: key='a value'"
    )


def parse_overrides(overrides: list[str]) -> list[Override]:
    try:
        return OverridesParser.create().parse_overrides(overrides)
    except OverrideParseException as exc:
        raise override_error(exc) from None


_GROUP_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_\-]*(/[A-Za-z0-9_][A-Za-z0-9_\-]*)*")


def _group_options(group: str, dirs: list[Path]) -> list[str] | None:
    """The options of a config group in the search path, or None when `group` is not one."""
    if not _GROUP_NAME.fullmatch(group):
        return None
    found = [d / group for d in dirs if (d / group).is_dir()]
    if not found:
        return None
    return sorted({p.stem for g in found for p in g.glob("*.yaml")})


def _shown(value: Any) -> str:
    return "null" if value is None else repr(value) if isinstance(value, str) else str(value)


def _check_overrides(parsed: list[Override], dirs: list[Path]) -> None:
    """What Hydra would take silently or crash on: a sweep without -m, a group set to a non-name."""
    problems = []
    for override in parsed:
        key, line = override.key_or_group, override.input_line
        if key == "hydra" or override.is_hydra_override():
            problems.append(error(key, f"{line} (command-line override): {HYDRA_SETTINGS}"))
            continue
        if not key:  # Hydra takes it for the root group and fails on the value
            raise UsageError(f"{line!r}: no key before the '='; {OVERRIDE_FORMS}")
        if override.is_sweep_override():
            raise UsageError(
                f"{line!r}: a sweep of several values runs only as `lmspec compile -m ...`; for a list value "
                f"write {key}=[a,b], for a string with commas quote it: {key}='a,b'"
            )
        options = _group_options(key, dirs)
        if options is None:
            continue
        value = override.value()
        names = value if isinstance(value, list) else [value]
        if override.is_delete():
            ok = value is None or isinstance(value, str)
        else:
            ok = isinstance(value, dict) or (bool(names) and all(isinstance(v, str) and v for v in names))
        if ok and any(isinstance(v, str) and "${" in v for v in names):
            ok, what = False, f"{_shown(value)} is an interpolation, not a preset's name"
        elif not ok:
            what = "an empty list chooses none" if value == [] else f"{_shown(value)} is not one"
        if not ok:
            problems.append(
                error(
                    key,
                    f"{line} (command-line override): {key} is a group of presets and {what}; choose one: "
                    f"{key}=OPTION with OPTION one of {', '.join(options) or '(none found)'}",
                )
            )
    if problems:
        raise SpecError(problems)


def _check_merges(cfg: DictConfig, parsed: list[Override], dirs: list[Path]) -> None:
    """`parallel={}` merges nothing into a section that has values: say so instead of ignoring it."""
    problems = []
    for override in parsed:
        if override.is_delete() or override.is_hydra_override() or override.value() != {}:
            continue
        key = override.key_or_group
        target = OmegaConf.select(cfg, key, default=None, throw_on_resolution_failure=False)
        if isinstance(target, DictConfig) and len(target) > 0:
            options = _group_options(key, dirs)
            pick = f"to pick a preset write {key}=OPTION ({', '.join(options)}); " if options else ""
            problems.append(
                error(
                    key,
                    f"{override.input_line} (command-line override): an empty mapping merges nothing, so {key} "
                    f"would keep every value it has; {pick}to change a value write {key}.KEY=VALUE, "
                    f"to remove the section ~{key}",
                )
            )
    if problems:
        raise SpecError(problems)


# --- hooks into Hydra's composition -----------------------------------------------------------


@dataclass
class _Reads:
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


def _shown_config(path: str, reads: _Reads) -> str:
    read = reads.by_config.get(path)
    return display_path(read.path) if read is not None else path


def _refuse_cycle(root: DefaultsTreeNode, reads: _Reads) -> None:
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


def _defaults_entry(reads: _Reads, parent: str | None, group: str | None, name: str | None) -> str:
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


def _missing_config(exc: MissingConfigException, tree: DefaultsTreeNode, reads: _Reads, searched: list[str]) -> Problem:
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


def _hooks(reads: _Reads, primary: Path | None) -> AbstractContextManager[None]:
    """Hydra hooked for one composition (compiler/spec/hydra_compat.py):

    - every file a file config source loads is read through `files` (compiler/spec/yaml_files.py):
      checked, parsed once by libyaml, shared with provenance; the `primary` spec file's defaults
      list gets lmspec's choice for each group it leaves out (`completed_defaults`);
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
            return {**read.data, "defaults": completed_defaults(list(read.data.get("defaults") or []))}, read.text
        return read.data, read.text

    def missing(exc: MissingConfigException, tree: DefaultsTreeNode, searched: list[str]) -> Exception:
        return SpecError([_missing_config(exc, tree, reads, searched)])

    return hydra_compat.composition_hooks(read, lambda root: _refuse_cycle(root, reads), missing, reads.defaults.append)


# --- compose ----------------------------------------------------------------------------------


def compose_spec(overrides: list[str], spec_file: Path | None = None) -> Composed:
    """Compose the default spec (or `spec_file`) with Hydra overrides, keeping provenance."""
    files = YamlFiles()
    if spec_file is not None:
        spec_file = resolve_spec_file(spec_file)
        _check_spec_file(spec_file, files)
    dirs = _search_dirs(spec_file)
    every = parse_overrides(list(overrides))
    nulled = _nulled(every)
    parsed = [o for o in every if o not in nulled]
    _check_overrides(parsed, dirs)
    config_name = spec_file.stem if spec_file else DEFAULT_CONFIG
    kept = [line for line, o in zip(overrides, every, strict=True) if o not in nulled]
    all_overrides = _hydra_overrides(spec_file) + kept
    reads = _Reads(files, parsed)
    GlobalHydra.instance().clear()
    try:
        with (
            initialize_config_dir(config_dir=str(dirs[0]), version_base=None, job_name="lmspec"),
            _hooks(reads, spec_file),
        ):
            cfg = compose(config_name=config_name, overrides=all_overrides, return_hydra_config=True)
            choices = {
                k: v for k, v in cfg.hydra.runtime.choices.items() if v is not None and not k.startswith("hydra/")
            }
            with open_dict(cfg):
                del cfg["hydra"]
            sources = []
            for d in reads.defaults[-1]:
                config_path, package = d.config_path or "", d.package or ""
                read = reads.by_config.get(config_path)
                if read is None or config_path.startswith("hydra/") or package.startswith("hydra"):
                    continue
                sources.append((read, package))
            origins = replay(sources, [*_value_override_keys(parsed, choices), *(o.key_or_group for o in nulled)])
            _check_merges(cfg, parsed, dirs)
            with open_dict(cfg):
                for override in nulled:
                    cfg[override.key_or_group] = None
            raw = OmegaConf.to_container(cfg, resolve=False)
            _refuse_expansion(raw, parsed, origins)
            try:
                # a spec's DictConfig, keyed by section names, converts to a dict of str keys
                spec = cast(dict[str, Any], OmegaConf.to_container(cfg, resolve=True))
            except (InterpolationResolutionError, GrammarParseError) as exc:
                raise SpecError([_interpolation_problem(raw, exc, parsed, origins)]) from None
    except SpecError:
        raise
    except (ConfigCompositionException, MissingConfigException, OmegaConfBaseException, ValueError) as exc:
        # ValueError: what Hydra raises for a malformed defaults list or group override that the
        # checks above did not foresee; a message, never a traceback.
        raise _rephrase(exc, overrides, reads) from None
    finally:
        GlobalHydra.instance().clear()
    return Composed(spec=spec, origins=origins, overrides=tuple(overrides), choices=choices)


# --- interpolations ---------------------------------------------------------------------------

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


def _refuse_expansion(raw: Any, parsed: list[Override], origins: Origins) -> None:
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


def _interpolation_problem(raw: Any, exc: OmegaConfBaseException, parsed: list[Override], origins: Origins) -> Problem:
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
        if absent in _known_keys():
            removed = next((o for o in parsed if o.is_delete() and o.key_or_group == absent), None)
            by = f" (removed by {removed.input_line!r})" if removed is not None else ""
            return error(
                absent,
                f"{absent}: missing{by}; {said} uses it as {broken.written}: set {absent} in the spec "
                f"or with {'' if removed is not None else '+'}{absent}=...",
            )
        hint = did_you_mean(reference, _known_keys())
        return error(broken.holder, f"{said}: {broken.written} names no key{hint}")
    if broken.why == "loop":
        return error(broken.holder, f"{said}: {broken.written} refers back to itself; give one of them a plain value")
    shown = f" {broken.written!r}" if broken.written else ""
    return error(broken.holder, f"{said}: cannot resolve{shown}: {_omegaconf_detail(exc, with_key=False)}")


def _known_keys() -> list[str]:
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


def _alias_or_hint(key: str, override: str, hint: str) -> str:
    """What lmspec calls the key (from the alias table), else the nearest key; and where keys are
    listed. No `+key` advice: the schema has no open mapping a new key could go in."""
    from lmspec.compiler.spec.aliases import lmspec_keys

    value = override.partition("=")[2]
    keys = lmspec_keys(key)
    if len(keys) == 1:
        said = f"; lmspec calls it {keys[0]}: {keys[0]}={value}"
    else:
        said = f"; lmspec has {' and '.join(keys)}" if keys else hint
    return f"{said} (every key: `lmspec schema`, schemas/spec.schema.json)"


def did_you_mean(word: str, candidates: list[str]) -> str:
    import difflib  # only on the error path

    close = difflib.get_close_matches(word, candidates, n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""


def _omegaconf_detail(exc: BaseException, with_key: bool = True) -> str:
    """OmegaConf's own message, one line, without its `full_key: ... object_type=...` trailer."""
    text = " ".join(str(exc).split("full_key:", 1)[0].split())
    key = getattr(exc, "full_key", None) if isinstance(exc, OmegaConfBaseException) else None
    return f"{key}: {text}" if key and with_key else text


def _rephrase(exc: Exception, overrides: list[str], reads: _Reads | None = None) -> Exception:
    """Hydra's errors, re-phrased: key first, then the fix."""
    text = str(exc).strip()
    if isinstance(exc, OverrideParseException):
        return override_error(exc)
    if isinstance(exc, MissingConfigException):
        options = f"; options: {', '.join(exc.options)}" if exc.options else ""
        return SpecError([error("<defaults>", f"{exc.missing_cfg_file}: no such config{options}")])
    for override in overrides:
        key = override.lstrip("+~").split("=", 1)[0]
        if hydra_compat.cannot_override(text, key) or hydra_compat.cannot_append(text, key):
            hint = did_you_mean(key, _known_keys())
            section = key.rpartition(".")[0]
            if hydra_compat.cannot_override(text, key) and key in _known_keys() and section:
                message = (
                    f"{key} (command-line override): {section} is not set (null or absent) in this spec, so it "
                    f"has no {key.rpartition('.')[2]} to override; set the section as a whole: "
                    f"{section}={{{key.rpartition('.')[2]}: ..., ...}}, or choose a preset that has one"
                )
            elif hydra_compat.cannot_override(text, key):
                message = f"{key} (command-line override): unknown key{_alias_or_hint(key, override, hint)}"
            else:
                message = f"{key} (command-line override): already set; drop the '+' to override it"
            return SpecError([error(key, message)])
        group = key.split("@", 1)[0]
        if override.startswith("+") and hydra_compat.chosen_twice(text, group):
            return SpecError(
                [
                    error(
                        group,
                        f"{override} (command-line override): the spec already chooses a {group}; "
                        f"drop the '+' to replace it: {override.lstrip('+')}",
                    )
                ]
            )
    text = hydra_compat.without_search_path(text)
    cause = exc.__cause__ or exc.__context__
    within = hydra_compat.merging_config(text)  # the config being merged: its file
    if within and reads is not None and within[0] in reads.by_config:
        shown = display_path(reads.by_config[within[0]].path)
        what = _omegaconf_detail(cause) if isinstance(cause, OmegaConfBaseException) else within[1]
        return SpecError([error("<compose>", f"{shown}: {what} (merging it over what comes before it in defaults)")])
    detail = f"{text}: {_omegaconf_detail(cause)}" if cause and text else text or _omegaconf_detail(exc)
    return SpecError([error("<compose>", " ".join(detail.split()))])
