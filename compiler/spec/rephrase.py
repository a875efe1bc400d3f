"""Hydra's and OmegaConf's exceptions that composition's own checks did not foresee, re-phrased into one
problem each: the key first, then the fix, never Hydra's text of search-path providers or a traceback."""

from __future__ import annotations

from hydra.errors import MissingConfigException, OverrideParseException
from omegaconf.errors import OmegaConfBaseException

from lmspec.compiler.errors import SpecError, error
from lmspec.compiler.paths import display_path
from lmspec.compiler.spec import hydra_compat
from lmspec.compiler.spec.defaults_list import Reads
from lmspec.compiler.spec.overrides import override_error
from lmspec.compiler.spec.suggest import did_you_mean, known_keys


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


def omegaconf_detail(exc: BaseException, with_key: bool = True) -> str:
    """OmegaConf's own message, one line, without its `full_key: ... object_type=...` trailer."""
    text = " ".join(str(exc).split("full_key:", 1)[0].split())
    key = getattr(exc, "full_key", None) if isinstance(exc, OmegaConfBaseException) else None
    return f"{key}: {text}" if key and with_key else text


def rephrase(exc: Exception, overrides: list[str], reads: Reads) -> Exception:
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
            hint = did_you_mean(key, known_keys())
            section = key.rpartition(".")[0]
            value = override.split("=", 1)[1].strip() if "=" in override else ""
            if hydra_compat.cannot_override(text, key) and key in known_keys() and value.startswith("{"):
                # Hydra merges a mapping into the one the spec holds and refuses keys that one lacks
                message = (
                    f"{key} (command-line override): a mapping given this way may only set keys {key} already "
                    f"has; replace it whole with ++{key}={value}, or add one entry with "
                    f"+{key}.NAME=VALUE"
                )
            elif hydra_compat.cannot_override(text, key) and key in known_keys() and section:
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
    if within and within[0] in reads.by_config:
        shown = display_path(reads.by_config[within[0]].path)
        what = omegaconf_detail(cause) if isinstance(cause, OmegaConfBaseException) else within[1]
        return SpecError([error("<compose>", f"{shown}: {what} (merging it over what comes before it in defaults)")])
    detail = f"{text}: {omegaconf_detail(cause)}" if cause and text else text or omegaconf_detail(exc)
    return SpecError([error("<compose>", " ".join(detail.split()))])
