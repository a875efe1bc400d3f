"""Where lmspec's own data lives: next to the packages, in a checkout or an install."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SPECS_DIR = ROOT / "specs"
SCHEMA_FILE = ROOT / "schemas" / "spec.schema.json"
TEMPLATES_DIR = ROOT / "templates"


def display_path(path: Path) -> str:
    """A path as a user reads it: relative to the working directory when inside it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)
