"""Compose a spec with Hydra: built-in groups, a user's own spec file, command-line overrides.

Returns the resolved spec as a plain dict plus where every leaf came from. This module is the
one entry point and holds the order of the steps; each step's checks and messages are a module
beside it: spec_file.py (`--spec`), overrides.py (the command line), defaults_list.py (lmspec's
hooks into Hydra's defaults lists), interpolations.py (`${...}`) and rephrase.py (Hydra's own
exceptions as problems that name the key and the fix).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import ConfigCompositionException, MissingConfigException
from omegaconf import OmegaConf, open_dict
from omegaconf.errors import GrammarParseError, InterpolationResolutionError, OmegaConfBaseException

from lmspec.compiler.errors import SpecError
from lmspec.compiler.spec.defaults_list import DEFAULT_CONFIG, Reads, hooks
from lmspec.compiler.spec.interpolations import interpolation_problem, refuse_expansion
from lmspec.compiler.spec.overrides import (
    check_merges,
    check_overrides,
    nulling_overrides,
    parse_overrides,
    value_override_keys,
)
from lmspec.compiler.spec.provenance import Origins, replay
from lmspec.compiler.spec.rephrase import rephrase
from lmspec.compiler.spec.sections.spec import ABSENT_IS_NULL
from lmspec.compiler.spec.spec_file import check_spec_file, resolve_spec_file, search_dirs, search_path_overrides
from lmspec.compiler.spec.yaml_files import YamlFiles


@dataclass(frozen=True)
class Composed:
    """A resolved spec, where each leaf came from, and how it was asked for."""

    spec: dict[str, Any]
    origins: Origins
    overrides: tuple[str, ...]
    choices: dict[str, str]


def compose_spec(overrides: list[str], spec_file: Path | None = None) -> Composed:
    """Compose the default spec (or `spec_file`) with Hydra overrides, keeping provenance."""
    files = YamlFiles()
    if spec_file is not None:
        spec_file = resolve_spec_file(spec_file)
        check_spec_file(spec_file, files)
    dirs = search_dirs(spec_file)
    every = parse_overrides(list(overrides))
    nulled = nulling_overrides(every)
    parsed = [o for o in every if o not in nulled]
    check_overrides(parsed, dirs)
    config_name = spec_file.stem if spec_file else DEFAULT_CONFIG
    kept = [line for line, o in zip(overrides, every, strict=True) if o not in nulled]
    all_overrides = search_path_overrides(spec_file) + kept
    reads = Reads(files, parsed)
    GlobalHydra.instance().clear()
    try:
        with (
            initialize_config_dir(config_dir=str(dirs[0]), version_base=None, job_name="lmspec"),
            hooks(reads, spec_file),
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
            origins = replay(sources, [*value_override_keys(parsed, choices), *(o.key_or_group for o in nulled)])
            check_merges(cfg, parsed, dirs)
            with open_dict(cfg):
                for override in nulled:
                    cfg[override.key_or_group] = None
            raw = OmegaConf.to_container(cfg, resolve=False)
            refuse_expansion(raw, parsed, origins)
            try:
                # a spec's DictConfig, keyed by section names, converts to a dict of str keys
                spec = cast(dict[str, Any], OmegaConf.to_container(cfg, resolve=True))
            except (InterpolationResolutionError, GrammarParseError) as exc:
                raise SpecError([interpolation_problem(raw, exc, parsed, origins)]) from None
            for name in ABSENT_IS_NULL:  # a group left at its null default (`- quantize: null`) is absent
                spec.setdefault(name, None)
    except SpecError:
        raise
    except (ConfigCompositionException, MissingConfigException, OmegaConfBaseException, ValueError) as exc:
        # ValueError: what Hydra raises for a malformed defaults list or group override that the
        # checks above did not foresee; a message, never a traceback.
        raise rephrase(exc, overrides, reads) from None
    finally:
        GlobalHydra.instance().clear()
    return Composed(spec=spec, origins=origins, overrides=tuple(overrides), choices=choices)
