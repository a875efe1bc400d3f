"""Where the project's own files are, for tests that read specs, docs, schemas or recorded logs."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LOG_DATA = ROOT / "tests" / "data" / "logs"
# The controllers' CustomResourceDefinitions (upstream data, not copied into the project: ../shared/k8s-crds/README.md);
# tests that read them skip where the folder is absent.
K8S_CRDS = ROOT.parent / "shared" / "k8s-crds"
