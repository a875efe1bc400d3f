"""`--spec`: the file a user names (a path, or a built-in preset's name), refused early when it cannot
be a whole spec (not .yaml, a group file such as a model preset), and the search path it composes with:
its own directory before lmspec's specs/."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from lmspec.compiler.errors import UsageError
from lmspec.compiler.paths import SPECS_DIR, display_path
from lmspec.compiler.spec.suggest import did_you_mean
from lmspec.compiler.spec.yaml_files import YamlFiles


def working_specs() -> Path | None:
    """The working directory's specs/ folder (a spec repository's, or one holding `lmspec import-model`'s
    specs/model/NAME.yaml), unless it is lmspec's own."""
    here = Path("specs").resolve()
    return here if here.is_dir() and here != SPECS_DIR else None


def search_dirs(spec_file: Path | None) -> list[Path]:
    """Where a group's options are looked for; Hydra composes from the first. A user's spec: its own
    directory first (its own specs/model/ etc.), then lmspec's specs/. lmspec's default spec or a built-in
    preset: lmspec's specs/, then the working directory's specs/ (`working_specs`), so that a group file of
    one's own is chosen by name (`model=NAME`) while every group the spec itself chooses stays lmspec's."""
    if spec_file is not None and spec_file.parent != SPECS_DIR:
        return [spec_file.parent, SPECS_DIR]
    here = working_specs()
    return [SPECS_DIR, here] if here is not None else [SPECS_DIR]


def search_path_overrides(spec_file: Path | None) -> list[str]:
    """The Hydra override that adds the search directories after the first (Hydra appends them)."""
    later = ", ".join(_quoted(f"file://{directory}") for directory in search_dirs(spec_file)[1:])
    return [f"hydra.searchpath=[{later}]"] if later else []


def _quoted(text: str) -> str:
    """`text` as a single-quoted value of Hydra's override grammar (a directory may hold `'`, `,` or `=`):
    a quote is escaped, and so is each backslash before one; any other backslash Hydra keeps as it is."""
    return "'" + re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", text) + "'"


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


def check_spec_file(spec_file: Path, files: YamlFiles) -> None:
    """Refuse, before Hydra reads it, a file it would not find (not .yaml) or that is one group's file
    (a model preset given as --spec), saying how to use it instead."""
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
