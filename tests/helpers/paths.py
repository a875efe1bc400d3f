"""Where the project's own files are, for tests that read specs, docs, schemas or recorded logs."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LOG_DATA = ROOT / "tests" / "data" / "logs"
