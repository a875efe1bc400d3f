"""Command-line overrides: parsed with Hydra's grammar, then checked for what Hydra would take silently or
crash on (a sweep without -m, a group set to a non-name, Hydra's own settings, `x={}` over a section
with values), and split into the overrides that set values (provenance marks them) and those that
null a section (lmspec applies them after Hydra composes)."""

from __future__ import annotations

import re
import typing
from pathlib import Path
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.errors import OverrideParseException
from omegaconf import DictConfig, OmegaConf

from lmspec.compiler.errors import Problem, SpecError, UsageError, error
from lmspec.compiler.paths import SPECS_DIR, display_path
from lmspec.compiler.spec import hydra_compat
from lmspec.compiler.spec.sections import Spec

HYDRA_SETTINGS = (
    "Hydra's own settings have no effect in lmspec, which only composes specs (the search path is the "
    "spec's directory, then lmspec's specs/); remove it"
)
OVERRIDE_FORMS = "overrides look like key=value, group=option, +new.key=value or ~key"


def override_error(exc: OverrideParseException) -> UsageError:
    """Hydra's grammar error, naming the override (quoted) and where in it the parser stopped."""
    detail = hydra_compat.grammar_error_detail(exc)
    return UsageError(
        f"cannot parse override {exc.override!r}: {detail}; {OVERRIDE_FORMS}, and a value holding spaces or "
        "any of ()[]{},=:'\" is quoted: key='a value'"
    )


def parse_overrides(overrides: list[str]) -> list[Override]:
    """The overrides as Hydra will read them; a grammar error as a UsageError that names the override."""
    try:
        return OverridesParser.create().parse_overrides(overrides)
    except OverrideParseException as exc:
        raise override_error(exc) from None


def value_override_keys(parsed: list[Override], choices: dict[str, str]) -> list[str]:
    """The keys the overrides set values of (not a group's choice, a deletion or Hydra's own): provenance
    marks each of them as set on the command line."""
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


def nulling_overrides(parsed: list[Override]) -> list[Override]:
    """`serve=null` or `~serve` for a section that may be null: the section is null, whatever files of
    the defaults list (hardware=cpu sizes serve too) put into it. lmspec sets it after Hydra composes."""
    sections = nullable_sections()
    return [
        o
        for o in parsed
        if o.key_or_group in sections and not o.is_hydra_override() and (o.is_delete() or o.value() is None)
    ]


_GROUP_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_\-]*(/[A-Za-z0-9_][A-Za-z0-9_\-]*)*")


def _group_options(group: str, dirs: list[Path]) -> list[str] | None:
    """The options of a config group in the search path, or None when `group` is not one."""
    if not _GROUP_NAME.fullmatch(group):
        return None
    found = [d / group for d in dirs if (d / group).is_dir()]
    if not found:
        return None
    return sorted({p.stem for g in found for p in g.glob("*.yaml")})


def _quoted_value(value: Any) -> str:
    """A defaults-list value in a message: a string quoted (its repr, so `''` and spaces show), None as null."""
    return "null" if value is None else repr(value) if isinstance(value, str) else str(value)


def check_overrides(parsed: list[Override], dirs: list[Path]) -> None:
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
        problems += [shadow for name in names if isinstance(name, str) and (shadow := _shadowed(key, line, name, dirs))]
        if override.is_delete():
            ok = value is None or isinstance(value, str)
        else:
            ok = isinstance(value, dict) or (bool(names) and all(isinstance(v, str) and v for v in names))
        if ok and any(isinstance(v, str) and "${" in v for v in names):
            ok, what = False, f"{_quoted_value(value)} is an interpolation, not a preset's name"
        elif not ok:
            what = "an empty list chooses none" if value == [] else f"{_quoted_value(value)} is not one"
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


def _shadowed(group: str, line: str | None, name: str, dirs: list[Path]) -> Problem | None:
    """An option of one's own (the working directory's specs/GROUP/NAME.yaml) that a built-in option of
    the same name hides: lmspec's specs/ comes first on the search path of its own specs."""
    found = [d / group / f"{name}.yaml" for d in dirs if (d / group / f"{name}.yaml").is_file()]
    if len(found) < 2 or found[0].parent.parent != SPECS_DIR:
        return None
    return error(
        group,
        f"{line} (command-line override): {display_path(found[1])} has the name of lmspec's own {group} "
        f"{name!r}, which lmspec's default spec and presets choose first; rename yours (and its name: key), "
        f"or choose it from a spec of your own: --spec FILE {line}",
    )


def check_merges(cfg: DictConfig, parsed: list[Override], dirs: list[Path]) -> None:
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
