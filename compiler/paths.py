"""Where lmspec's own data lives: next to the packages, in a checkout or an install."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SPECS_DIR = ROOT / "specs"
SCHEMA_FILE = ROOT / "schemas" / "spec.schema.json"
TEMPLATES_DIR = ROOT / "templates"


BUILTIN_PREFIX = "lmspec:"


def display_path(path: Path) -> str:
    """A path as a user reads it. lmspec's own specs are `lmspec:specs/...` wherever lmspec is
    installed, so messages copied into artifacts are the same on every machine; other files are
    relative to the working directory when inside it."""
    resolved = path.resolve()
    if resolved.is_relative_to(SPECS_DIR):
        return f"{BUILTIN_PREFIX}{resolved.relative_to(ROOT).as_posix()}"
    try:
        return str(resolved.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)
