"""`lmspec import-model`: a model group file (specs/model/NAME.yaml) from a released HF config.json.

The family is the one whose transformers class is the config's `architectures[0]`; its
`from_hf_config` reads the fields it keeps and refuses what lmspec cannot carry over, and any field
left unread is refused here by name, so an import is exact or is no import. The file names its
source and the source's sha256 (the review trail of where an architecture came from).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import re
import typing
from pathlib import Path
from typing import Any

from lmspec.compiler.cli.help_text import described
from lmspec.compiler.errors import EXIT_OK, UsageError
from lmspec.compiler.families.hf_model import model_group, refuse_unchecked

IMPORT_HEADER = "# Imported by `lmspec import-model` from "  # an existing file not starting so is not replaced
MODEL_SCHEMA = "model.schema.json"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "import-model",
        help="write a model group file from a Hugging Face config.json",
        **described(
            "Translate a Hugging Face config.json (Llama, Mistral, Mixtral, Qwen2, Qwen3, Qwen3-MoE, DeepSeek) into an "
            "lmspec model group file, so `model=NAME` describes your own model.",
            "lmspec import-model /models/Qwen2.5-7B/config.json -o specs/model/qwen2_5_7b.yaml",
            "lmspec import-model /models/my-model -o specs/model/mine.yaml --name mine",
        ),
    )
    p.add_argument("source", type=Path, metavar="CONFIG_JSON_OR_DIR", help="a config.json, or the directory holding it")
    p.add_argument("-o", "--output", type=Path, required=True, help="the file to write, e.g. specs/model/NAME.yaml")
    p.add_argument("--name", help="model.name (default: the output file's stem)")
    p.set_defaults(handler=_cmd_import_model)


def read_config(source: Path) -> tuple[Path, bytes, dict[str, Any]]:
    """(the config.json's path, its bytes, its fields); a directory stands for its config.json."""
    path = source / "config.json" if source.is_dir() else source
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        config = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path} is not JSON: {exc}") from None
    if not isinstance(config, dict):
        raise UsageError(f"{path} holds a JSON {type(config).__name__}, not a config object")
    return path, data, config


def _ordered(cls: type, group: dict[str, Any]) -> dict[str, Any]:
    """`group` in the order of `cls`'s fields (the presets' and the schema's order), nested groups too."""
    hints = typing.get_type_hints(cls)
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        value = group[f.name]
        inner = [a for a in typing.get_args(hints[f.name]) if isinstance(a, type) and dataclasses.is_dataclass(a)]
        out[f.name] = _ordered(inner[0], value) if inner and isinstance(value, dict) else value
    return out


def schema_reference(output: Path) -> str:
    """The model schema the group's modeline names, valid wherever the file is checked out: relative to
    the nearest `schemas/model.schema.json` above it (a spec repository's, which `lmspec init` writes, or
    lmspec's own), else the schema's published id. Never a path of this machine's install."""
    from lmspec.compiler.spec.schema import SCHEMA_ID

    folder = output.resolve().parent
    for above in (folder, *folder.parents):
        schema = above / "schemas" / MODEL_SCHEMA
        if schema.is_file():
            return Path(os.path.relpath(schema, folder)).as_posix()
    return SCHEMA_ID.replace("spec.schema.json", MODEL_SCHEMA)


def group_text(group: dict[str, Any], source: Path, digest: str, output: Path) -> str:
    import yaml

    from lmspec.compiler.paths import display_path
    from lmspec.compiler.spec.sections import ModelSpec

    body = yaml.safe_dump(_ordered(ModelSpec, group), sort_keys=False, default_flow_style=False, width=1000)
    header = f"{IMPORT_HEADER}{display_path(source)} (sha256 {digest}).\n"
    return f"{header}# yaml-language-server: $schema={schema_reference(output)}\n{body}"


def usage_hint(output: Path) -> str:
    """How to choose the group just written by name (its file's stem): from the directory whose
    specs/model/ holds it (in a spec repository, with the job it goes into), or in a spec's defaults."""
    from lmspec.compiler.cli.spec_repo import SPECS, is_spec_repository
    from lmspec.compiler.paths import display_path

    option, folder = output.stem, output.resolve().parent
    if (folder.name, folder.parent.name) != ("model", SPECS.name):
        return (
            f"to choose it as model={option}, move it to a specs/model/ folder (beside your spec, or in the "
            "directory you run lmspec from)"
        )
    root = folder.parent.parent
    where = "" if root == Path.cwd().resolve() else f"cd {display_path(root)} && "
    job = f"--spec {SPECS}/JOB.yaml " if is_spec_repository(root) else ""
    return f"use it: {where}lmspec check {job}model={option}, or `- model: {option}` in a spec's defaults list"


def _cmd_import_model(args: argparse.Namespace) -> int:
    from lmspec.compiler.build.atomic import write_file_atomic
    from lmspec.compiler.build.ownership import require_own_file
    from lmspec.compiler.spec.kinds import PLAIN_NAME

    output: Path = args.output
    if output.suffix != ".yaml":  # Hydra finds a group option by its name + ".yaml"
        raise UsageError(f"-o {output}: a model group file ends in .yaml (e.g. specs/model/NAME.yaml)")
    name = args.name if args.name is not None else output.stem
    if not re.fullmatch(PLAIN_NAME.pattern, name):
        raise UsageError(f"model name {name!r} is not {PLAIN_NAME.what}; pass --name")
    require_own_file(output, IMPORT_HEADER)  # before reading: a refusal costs nothing
    path, data, config = read_config(args.source)
    group = model_group(config, name)
    refuse_unchecked(config, group)
    write_file_atomic(
        output, group_text(group, path, hashlib.sha256(data).hexdigest(), output), owned_prefix=IMPORT_HEADER
    )
    print(f"wrote {output} ({group['family']}, {group['num_layers']} layers, from {path})")
    print(usage_hint(output))
    return EXIT_OK
