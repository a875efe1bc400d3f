"""Write a build directory atomically, with a manifest of sha256s; or check one for drift."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from compiler.earlier import MANIFEST, EarlierBuild
from compiler.emit import emit_all
from compiler.emit.spec_files import dump_json
from compiler.errors import UsageError
from compiler.plan import Plan

EXECUTABLE_SUFFIXES = (".sh",)


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def build_files(plan: Plan, replacing: Path | None = None) -> dict[str, str]:
    """Every artifact of the plan plus manifest.json, which records how the build was made.

    `replacing` is the build directory these files will replace or be checked against: an
    untouched chart there drawn from the same numbers is kept instead of redrawn.
    """
    files = emit_all(plan, EarlierBuild(replacing) if replacing is not None else None)
    files[MANIFEST] = dump_json(
        {
            "lmspec_version": plan.lmspec_version,
            "name": plan.name,
            "overrides": list(plan.overrides),
            "choices": dict(plan.choices),
            "spec_sha256": sha256(files["spec.resolved.yaml"]),
            "files": {path: sha256(text) for path, text in files.items()},
        }
    )
    return dict(sorted(files.items()))


def _write_tree(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w", encoding="utf-8", newline="\n") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        path.chmod(0o755 if rel.endswith(EXECUTABLE_SUFFIXES) else 0o644)


def write_build(target: Path, files: dict[str, str]) -> None:
    """Write into a sibling temp dir, then swap it in; on any failure the old build stays."""
    parent = target.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=parent))
    except OSError as exc:
        raise UsageError(f"cannot write the build under {parent}: {exc.strerror}") from None
    try:
        _write_tree(staging, files)
        staging.chmod(0o755)
        if target.exists():
            retired = parent / f".{target.name}.old-{os.getpid()}"
            os.rename(target, retired)
            os.rename(staging, target)
            shutil.rmtree(retired)
        else:
            os.rename(staging, target)
    except OSError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise UsageError(f"cannot write the build {target}: {exc}") from None
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def stale_files(target: Path, files: dict[str, str]) -> list[str]:
    """`path (missing|changed|not emitted)` for each file that differs from a fresh compile."""
    differences = []
    for rel, text in files.items():
        path = target / rel
        if not path.is_file():
            differences.append(f"{rel} (missing)")
        elif path.read_text(encoding="utf-8") != text:
            differences.append(f"{rel} (changed)")
    if target.is_dir():
        on_disk = {p.relative_to(target).as_posix() for p in target.rglob("*") if p.is_file()}
        differences += [f"{rel} (not emitted)" for rel in sorted(on_disk - files.keys())]
    return differences
