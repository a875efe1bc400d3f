"""Compose a spec with Hydra: built-in groups, a user's own spec file, command-line overrides.

Returns the resolved spec as a plain dict plus where every leaf came from. Hydra's
own exceptions are re-phrased here into problems that name the key and the fix.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from hydra import compose, initialize_config_dir
from hydra._internal import config_loader_impl
from hydra._internal.defaults_list import DefaultsList
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException
from omegaconf import OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from compiler.errors import SpecError, UsageError, error
from compiler.paths import SPECS_DIR, display_path
from compiler.provenance import SAFE_LOADER, Origins, replay

DEFAULT_CONFIG = "config"


@dataclass(frozen=True)
class Composed:
    """A resolved spec, where each leaf came from, and how it was asked for."""

    spec: dict[str, Any]
    origins: Origins
    overrides: tuple[str, ...]
    choices: dict[str, str]


def _search_dirs(spec_file: Path | None) -> list[Path]:
    return [spec_file.parent, SPECS_DIR] if spec_file and spec_file.parent != SPECS_DIR else [SPECS_DIR]


def _find_source(config_path: str, dirs: list[Path]) -> Path | None:
    for d in dirs:
        candidate = d / f"{config_path}.yaml"
        if candidate.is_file():
            return candidate
    return None


def _value_override_keys(overrides: list[str], choices: dict[str, str]) -> list[str]:
    keys = []
    for parsed in OverridesParser.create().parse_overrides(overrides):
        key = parsed.key_or_group
        if parsed.is_hydra_override() or key in choices or parsed.is_delete():
            continue
        keys.append(key)
    return keys


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
    presets = sorted(p.stem for p in SPECS_DIR.glob("*.yaml"))
    raise UsageError(f"--spec {spec_file}: no such file, nor a built-in preset ({', '.join(presets)})")


def _check_spec_file(spec_file: Path) -> None:
    if spec_file.suffix not in (".yaml", ".yml"):
        raise UsageError(f"--spec {spec_file}: expected a .yaml file")
    try:
        yaml.load(spec_file.read_text(encoding="utf-8"), Loader=SAFE_LOADER)
    except yaml.YAMLError as exc:
        raise SpecError([error("<file>", f"{display_path(spec_file)}: YAML syntax error: {exc}")]) from None


@contextmanager
def _defaults_list_of_compose() -> Iterator[list[DefaultsList]]:
    """The defaults list Hydra builds while composing (the sources in merge order).

    Hydra's `compose` computes it but does not return it; asking `compute_defaults_list`
    again reloads every YAML file (a third of a compile's own time), so it is caught on
    the way instead. hydra-core is pinned to 1.3.x, where compose calls this module-level
    function once per composition.
    """
    caught: list[DefaultsList] = []
    create = config_loader_impl.create_defaults_list

    def catching(*args: Any, **kwargs: Any) -> DefaultsList:
        caught.append(create(*args, **kwargs))
        return caught[-1]

    config_loader_impl.create_defaults_list = catching
    try:
        yield caught
    finally:
        config_loader_impl.create_defaults_list = create


def compose_spec(overrides: list[str], spec_file: Path | None = None) -> Composed:
    """Compose the default spec (or `spec_file`) with Hydra overrides, keeping provenance."""
    if spec_file is not None:
        spec_file = resolve_spec_file(spec_file)
        _check_spec_file(spec_file)
    dirs = _search_dirs(spec_file)
    config_name = spec_file.stem if spec_file else DEFAULT_CONFIG
    all_overrides = _hydra_overrides(spec_file) + list(overrides)
    GlobalHydra.instance().clear()
    try:
        with (
            initialize_config_dir(config_dir=str(dirs[0]), version_base=None, job_name="lmspec"),
            _defaults_list_of_compose() as caught,
        ):
            cfg = compose(config_name=config_name, overrides=all_overrides, return_hydra_config=True)
            defaults = caught[-1].defaults
            choices = {
                k: v for k, v in cfg.hydra.runtime.choices.items() if v is not None and not k.startswith("hydra/")
            }
            with open_dict(cfg):
                del cfg["hydra"]
            spec = OmegaConf.to_container(cfg, resolve=True)
    except (
        ConfigCompositionException,
        MissingConfigException,
        OverrideParseException,
        OmegaConfBaseException,
        yaml.YAMLError,
    ) as exc:
        raise _rephrase(exc, overrides) from None
    finally:
        GlobalHydra.instance().clear()
    sources = []
    for d in defaults:
        if d.config_path is None or d.config_path.startswith("hydra/") or d.package.startswith("hydra"):
            continue
        path = _find_source(d.config_path, dirs)
        if path is not None:
            sources.append((path, d.package or ""))
    origins = replay(sources, _value_override_keys(list(overrides), choices))
    return Composed(spec=spec, origins=origins, overrides=tuple(overrides), choices=choices)


def _known_keys() -> list[str]:
    from compiler.schema import spec_schema

    keys: list[str] = []

    def walk(node: dict[str, Any], prefix: str) -> None:
        for name, prop in node.get("properties", {}).items():
            dotted = f"{prefix}{name}"
            keys.append(dotted)
            for option in [prop, *prop.get("anyOf", [])]:
                walk(option, dotted + ".")

    walk(spec_schema(), "")
    return keys


def did_you_mean(word: str, candidates: list[str]) -> str:
    import difflib  # only on the error path

    close = difflib.get_close_matches(word, candidates, n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""


def _rephrase(exc: Exception, overrides: list[str]) -> Exception:
    """Hydra's errors, re-phrased: key first, then the fix; grammar errors are usage errors."""
    text = str(exc).strip()
    if isinstance(exc, OverrideParseException):
        return UsageError(
            f"cannot parse override: {text}. Overrides look like key=value, group=option, +new.key=value or ~key"
        )
    if isinstance(exc, MissingConfigException):
        return SpecError([error("<defaults>", text.replace("\n\n", "\n").replace("\n", " "))])
    for override in overrides:
        key = override.lstrip("+~").split("=", 1)[0]
        if (
            f"Could not override '{key}'" in text
            or f"Could not append to config. An item is already at '{key}'" in text
        ):
            hint = did_you_mean(key, _known_keys())
            if "Could not override" in text:
                message = (
                    f"{key} (command-line override): unknown key{hint} "
                    f"(to add a new key use +{key}=...; lmspec's schema "
                    "allows only the keys in schemas/spec.schema.json)"
                )
            else:
                message = f"{key} (command-line override): already set; drop the '+' to override it"
            return SpecError([error(key, message)])
    cause = exc.__cause__ or exc.__context__
    detail = f"{text}: {cause}" if cause else text
    return SpecError([error("<compose>", " ".join(detail.split()))])
