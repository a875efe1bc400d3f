"""The one seam into Hydra's internals: hydra-core 1.3.x, the release whose private names these are.

lmspec composes with Hydra's public `compose`, and for the length of one composition
(`composition_hooks`) replaces four functions that Hydra 1.3 looks up by name at each call,
so a hook sees every call and Hydra is its own again when the block ends:

- `FileConfigSource.load_config`: each file is read by lmspec's checked YAML reader;
- `defaults_list._create_defaults_tree_impl`: each defaults-tree node is shown to lmspec first
  (an include loop is refused before Hydra recurses until Python's stack ends);
- `defaults_list.config_not_found_error`: Hydra's MissingConfigException (`.missing_cfg_file`,
  `.options`) is handed to lmspec, which words the problem;
- `config_loader_impl.create_defaults_list`: the defaults list `compose` builds but never returns.

Also here: the sweep's split of `a=1,2` (Hydra's BasicSweeper, a private module) and the
wordings of the Hydra errors that carry nothing but their text (ConfigCompositionException
and OverrideParseException's grammar detail have no attributes for them), matched here and
nowhere else. tests/compiler/test_hydra_compat.py pins each of these against the installed Hydra.

Another Hydra release is refused (HydraVersionError), not warned about: its loader may no
longer call these names, and then every YAML check would silently stop happening.
"""

from __future__ import annotations

import functools
import inspect
import os
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hydra._internal import config_loader_impl, defaults_list
from hydra._internal.core_plugins import file_config_source
from hydra.core.default_element import DefaultsTreeNode, ResultDefault
from hydra.core.override_parser.types import Override
from hydra.errors import MissingConfigException, OverrideParseException
from hydra.plugins.config_source import ConfigLoadError, ConfigResult, ConfigSource
from omegaconf import OmegaConf

from lmspec.compiler.errors import UsageError

HYDRA_CORE = "1.3"  # the release series (pyproject.toml: hydra-core>=1.3.2,<1.4)
SEAM = "lmspec.compiler.spec.hydra_compat"


class HydraVersionError(UsageError):
    """hydra-core is installed at a release this seam was not written for."""


def hydra_version_problem(installed: str) -> str | None:
    """Why hydra-core `installed` cannot be hooked, or None for a 1.3.x release."""
    if installed.split(".")[:2] == HYDRA_CORE.split("."):
        return None
    return (
        f"hydra-core {installed} is installed, but {SEAM} hooks hydra-core {HYDRA_CORE}.x's private functions "
        f"(the pin in lmspec's pyproject.toml); install 'hydra-core>={HYDRA_CORE}.2,<1.4'"
    )


@functools.cache
def require_hydra() -> None:
    """hydra.__version__, not importlib.metadata: the metadata import alone costs ~7% of a rebuild."""
    import hydra

    problem = hydra_version_problem(hydra.__version__)
    if problem is not None:
        raise HydraVersionError(problem)


# --- the hooks --------------------------------------------------------------------------------

ReadFile = Callable[[str, Path], tuple[dict[str, Any] | None, str]]  # (config path, file) -> (value, text)
OnMissing = Callable[[MissingConfigException, DefaultsTreeNode, list[str]], Exception]


@contextmanager
def composition_hooks(
    read: ReadFile,
    before_subtree: Callable[[DefaultsTreeNode], None],
    on_missing: OnMissing,
    on_defaults: Callable[[list[ResultDefault]], None],
) -> Iterator[None]:
    """Hydra's four functions hooked for the block (the module docstring says why each):

    - `read(config_path, file)` gives a config file's value and text (for Hydra's header);
    - `before_subtree(node)` sees each defaults-tree node before Hydra expands it (may raise);
    - `on_missing(exc, node, searched)` turns Hydra's MissingConfigException for `node` into the
      exception raised instead; `searched` lists the file directories of the search path;
    - `on_defaults(defaults)` gets each defaults list Hydra builds (the last is the composed one).
    """
    require_hydra()
    # Looked up now: Hydra's plugin scan re-executes its core plugin modules (new classes) once
    # a process, on the first initialize.
    source_class = file_config_source.FileConfigSource
    load_config = source_class.load_config
    tree_impl = defaults_list._create_defaults_tree_impl
    root_at = list(inspect.signature(tree_impl).parameters).index("root")  # where `root` comes positionally
    not_found = defaults_list.config_not_found_error
    create = config_loader_impl.create_defaults_list

    def loading(source: Any, config_path: str) -> ConfigResult:
        full_path = os.path.realpath(os.path.join(source.path, source._normalize_file_name(config_path)))
        if not os.path.exists(full_path):
            raise ConfigLoadError(f"Config not found : {full_path}")
        data, text = read(config_path, Path(full_path))
        return ConfigResult(
            config=OmegaConf.create(data or {}),
            path=f"{source.scheme()}://{source.path}",
            provider=source.provider,
            header=ConfigSource._get_header_dict(text[:512]),
        )

    def guarded(*args: Any, **kwargs: Any) -> DefaultsTreeNode:
        before_subtree(kwargs["root"] if "root" in kwargs else args[root_at])
        return tree_impl(*args, **kwargs)

    def missing(repo: Any, tree: DefaultsTreeNode) -> None:
        try:
            not_found(repo=repo, tree=tree)
        except MissingConfigException as exc:
            searched = [s.path for s in repo.get_sources() if s.scheme() == "file"]
            raise on_missing(exc, tree, searched) from None

    def catching(*args: Any, **kwargs: Any) -> Any:
        built = create(*args, **kwargs)
        on_defaults(built.defaults)
        return built

    source_class.load_config = loading  # type: ignore[method-assign,assignment]  # deliberate hook of Hydra's loader
    defaults_list._create_defaults_tree_impl = guarded
    defaults_list.config_not_found_error = missing
    config_loader_impl.create_defaults_list = catching
    try:
        yield
    finally:
        source_class.load_config = load_config  # type: ignore[method-assign]  # restores Hydra's own loader
        defaults_list._create_defaults_tree_impl = tree_impl
        defaults_list.config_not_found_error = not_found
        config_loader_impl.create_defaults_list = create


# --- the sweep --------------------------------------------------------------------------------


def split_sweep(parsed: list[Override]) -> list[list[str]]:
    """Every combination of a multirun's overrides, in Hydra's order (its BasicSweeper's split)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

    require_hydra()
    return [list(combo) for batch in BasicSweeper.split_arguments(parsed, max_batch_size=None) for combo in batch]


# --- Hydra 1.3's wordings of errors that carry no attributes ----------------------------------


def grammar_error_detail(exc: OverrideParseException) -> str:
    """Where Hydra's override grammar stopped, from `exc.message` (ANTLR's text: no position attribute)."""
    lines = [line for line in exc.message.splitlines() if line.strip() and not line.startswith("See https://")]
    if lines and lines[0].startswith("LexerNoViableAltException: ") and len(lines) > 1:
        at = lines[1].index("^") - len("LexerNoViableAltException: ")
        detail = f"unexpected character {exc.override[at : at + 1]!r} at position {at + 1}"
    elif lines and lines[0].startswith("Error parsing override"):
        detail = " ".join(lines[1:])
    else:
        detail = " ".join(lines)
    return re.sub(r" expecting \{[^}]*\}", "", detail)  # ANTLR's list of every token it could take


def cannot_override(text: str, key: str) -> bool:
    """Hydra's "no such key" for `key=value` (a ConfigCompositionException's text)."""
    return f"Could not override '{key}'" in text


def cannot_append(text: str, key: str) -> bool:
    """Hydra's "already set" for `+key=value`."""
    return f"Could not append to config. An item is already at '{key}'" in text


def chosen_twice(text: str, group: str) -> bool:
    """Hydra's error for `+group=option` when the defaults list already chooses one of `group`."""
    return text == f"{group} appears more than once in the final defaults list"


def without_search_path(text: str) -> str:
    """Hydra's text without its search-path listing (tabs, `provider=hydra, path=pkg://hydra.conf`) and links."""
    text = text.split("Config search path:", 1)[0]
    return " ".join(line.strip() for line in text.splitlines() if line.strip() and "https://" not in line)


_MERGING = re.compile(r"In '([^']+)': ")


def merging_config(text: str) -> tuple[str, str] | None:
    """(config path, the rest) of Hydra's "In 'config': ..." for an error while merging that config."""
    within = _MERGING.match(text)
    return (within.group(1), text[within.end() :]) if within else None
