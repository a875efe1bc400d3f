"""Damaged builds: every runtime reader refuses them with exit 2, one line naming the file and the fix.

A tiny build is compiled once; each case copies it into a fresh working directory, damages one
file in a stated way, runs a stage's reading entry point (`lmspec run build/tiny --stage S
--dry-run`, or the `python -m` module an emitted script calls) and checks the exit code, the
message, that no traceback was printed and that the working directory (build included) is
exactly as it was before (tests/helpers/tree.py). The mechanism under test is
compiler/build/reader.py's Build.open.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers.tree import snapshot

from lmspec.compiler import __version__
from lmspec.compiler.build.files import (
    MANIFEST,
    MAPPING,
    NCCL_ENV,
    PLAN,
    SBATCH_SH,
    SERVE_SH,
    SPEC,
    TORCHRUN_SH,
    VLLM_YAML,
)
from lmspec.compiler.build.reader import MAX_FILE_BYTES, MAX_MANIFEST_BYTES
from lmspec.compiler.build.writer import write_build
from lmspec.compiler.cli.main import run as lmspec_run
from lmspec.compiler.emit.manifest import build_files
from lmspec.compiler.pipeline import make_plan

BUILD = Path("build/tiny")
TORCHRUN, SBATCH, NCCL = TORCHRUN_SH, SBATCH_SH, NCCL_ENV
EDITED = "changed since lmspec compiled it"
RECOMPILE = "recompile it: `lmspec compile -o build`"
MOVE_ASIDE = "move build/tiny aside and compile again"

Damage = Callable[[Path], None]  # applied to build/tiny


# ---- how a file is damaged -------------------------------------------------------------------


def edit_byte(rel: str, at: float = 0.5) -> Damage:
    """One byte in the middle of `rel` changed (a different printable character)."""

    def damage(build: Path) -> None:
        path = build / rel
        data = bytearray(path.read_bytes())
        i = int(len(data) * at)
        data[i] = ord("x") if data[i] != ord("x") else ord("y")
        path.write_bytes(bytes(data))

    return damage


def replace_text(rel: str, old: str, new: str, rehash: bool = False) -> Damage:
    def damage(build: Path) -> None:
        path = build / rel
        text = path.read_text(encoding="utf-8")
        assert old in text, old
        path.write_text(text.replace(old, new, 1), encoding="utf-8")
        if rehash:
            forge_manifest(build, rel)

    return damage


def write(rel: str, data: bytes, rehash: bool = False) -> Damage:
    def damage(build: Path) -> None:
        (build / rel).write_bytes(data)
        if rehash:
            forge_manifest(build, rel)

    return damage


def truncate(rel: str) -> Damage:
    def damage(build: Path) -> None:
        path = build / rel
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])

    return damage


def delete(rel: str) -> Damage:
    return lambda build: (build / rel).unlink()


def fifo(rel: str) -> Damage:
    def damage(build: Path) -> None:
        (build / rel).unlink()
        os.mkfifo(build / rel)

    return damage


def directory(rel: str) -> Damage:
    def damage(build: Path) -> None:
        (build / rel).unlink()
        (build / rel).mkdir()

    return damage


def symlink_to_copy(rel: str) -> Damage:
    """A symlink to a byte-identical copy outside the build: the hash would match, the link is refused."""

    def damage(build: Path) -> None:
        copy = build.parent.parent / f"copy-of-{rel.replace('/', '_')}"
        if (build / rel).is_dir():
            shutil.copytree(build / rel, copy)
            shutil.rmtree(build / rel)
        else:
            shutil.copy2(build / rel, copy)
            (build / rel).unlink()
        (build / rel).symlink_to(copy)

    return damage


def sparse(rel: str, size: int) -> Damage:
    """`rel` grown to `size` bytes without writing them (a hole): refused by its size, never read."""
    return lambda build: os.truncate(build / rel, size)


def dangling(rel: str) -> Damage:
    def damage(build: Path) -> None:
        (build / rel).unlink()
        (build / rel).symlink_to("no-such-file")

    return damage


def symlink_loop(rel: str) -> Damage:
    def damage(build: Path) -> None:
        (build / rel).unlink()
        (build / rel).symlink_to(Path(rel).name)

    return damage


def dir_as_file(rel: str) -> Damage:
    def damage(build: Path) -> None:
        shutil.rmtree(build / rel)
        (build / rel).write_text("not a directory\n")

    return damage


def edit_json(rel: str, change: Callable[[dict], object], rehash: bool = False) -> Damage:
    """`rel` parsed, changed by `change` (which may return a replacement document), written back."""

    def damage(build: Path) -> None:
        path = build / rel
        doc = json.loads(path.read_text(encoding="utf-8"))
        replaced = change(doc)
        path.write_text(json.dumps(doc if replaced is None else replaced, indent=2), encoding="utf-8")
        if rehash:
            forge_manifest(build, rel)

    return damage


def forge_manifest(build: Path, rel: str) -> None:
    """The deliberate forgery: manifest.json rewritten to hash the edited file, so only what
    the reader checks beyond hashes (schema, shape) can refuse it."""
    path = build / MANIFEST
    manifest = json.loads(path.read_text(encoding="utf-8"))
    digest = hashlib.sha256((build / rel).read_bytes()).hexdigest()
    manifest["files"][rel] = digest
    if rel == SPEC:
        manifest["spec_sha256"] = digest
    path.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _set(key: str, value: object) -> Callable[[dict], None]:
    return lambda doc: doc.__setitem__(key, value)


def _set_file_hash(rel: str) -> Callable[[dict], None]:
    return lambda doc: doc["files"].__setitem__(rel, "0" * 64)


def _drop_file(rel: str) -> Callable[[dict], None]:
    return lambda doc: _pop(rel)(doc["files"])


def _pop(key: str) -> Callable[[dict], None]:
    def change(doc: dict) -> None:
        del doc[key]

    return change


# ---- where the build is read -----------------------------------------------------------------


def _cli(stage: str) -> Callable[[], int]:
    return lambda: lmspec_run(["run", str(BUILD), "--stage", stage, "--dry-run"])


def _module(name: str, *argv: str) -> Callable[[], int]:
    def call() -> int:
        import importlib

        return importlib.import_module(name).main([*argv])

    return call


ENTRY: dict[str, Callable[[], int]] = {
    "train": _cli("train"),
    "convert": _cli("convert"),
    "verify": _cli("verify"),
    "serve": _cli("serve"),
    # what the emitted scripts run when a user starts them by hand
    "lmspec.runtime.train.loop": _module("lmspec.runtime.train.loop", str(BUILD)),
    "lmspec.runtime.convert.to_hf": _module("lmspec.runtime.convert.to_hf", str(BUILD)),
    "lmspec.runtime.verify": _module("lmspec.runtime.verify", str(BUILD)),
    "lmspec-vllm": _module("lmspec.runtime.serve.vllm_cli", "serve", "--config", str(BUILD / VLLM_YAML)),
}


def _edited(rel: str) -> list[str]:
    return [f"{BUILD / rel}: {EDITED}", RECOMPILE]


def _manifest(problem: str) -> list[str]:
    return [f"error: {BUILD / MANIFEST}: ", problem, MOVE_ASIDE]


def _refused(rel: str, problem: str) -> list[str]:
    return [f"error: {BUILD / rel}: ", problem, RECOMPILE]


CASES = [
    # -- a file edited by hand: the sha256 differs from the manifest's
    pytest.param("train", edit_byte(SPEC), _edited(SPEC), id="spec-one-byte-train"),
    pytest.param(
        "train",
        replace_text(SPEC, "launcher: local", "launcher: pbs"),
        [*_edited(SPEC), f"lmspec compile --spec {BUILD / SPEC} -o build"],
        id="spec-launcher-pbs-train",
    ),
    pytest.param("serve", replace_text(SPEC, "port: 8000", "port: 8001"), _edited(SPEC), id="spec-port-serve"),
    pytest.param("verify", edit_byte(SPEC, 0.9), _edited(SPEC), id="spec-one-byte-verify"),
    pytest.param("lmspec.runtime.train.loop", edit_byte(SPEC), _edited(SPEC), id="spec-one-byte-runtime-train"),
    pytest.param("lmspec.runtime.train.loop", edit_byte(PLAN), _edited(PLAN), id="plan-one-byte-runtime-train"),
    pytest.param("convert", edit_byte(MAPPING), _edited(MAPPING), id="mapping-one-byte-convert"),
    pytest.param("verify", edit_byte(MAPPING, 0.2), _edited(MAPPING), id="mapping-one-byte-verify"),
    pytest.param(
        "lmspec.runtime.convert.to_hf", edit_byte(MAPPING), _edited(MAPPING), id="mapping-one-byte-runtime-convert"
    ),
    pytest.param("lmspec.runtime.verify", edit_byte(MAPPING), _edited(MAPPING), id="mapping-one-byte-runtime-verify"),
    pytest.param(
        "train",
        replace_text(TORCHRUN, "set -euo pipefail\n", "set -euo pipefail\ntouch pwned\n"),
        _edited(TORCHRUN),
        id="torchrun-injected-command-train",
    ),
    pytest.param("train", edit_byte(SBATCH), _edited(SBATCH), id="sbatch-one-byte-train"),
    pytest.param("train", edit_byte(NCCL), _edited(NCCL), id="nccl-env-one-byte-train"),
    pytest.param("lmspec.runtime.train.loop", edit_byte(NCCL), _edited(NCCL), id="nccl-env-one-byte-runtime-train"),
    pytest.param("serve", edit_byte(SERVE_SH), _edited(SERVE_SH), id="serve-sh-one-byte-serve"),
    pytest.param("serve", edit_byte(VLLM_YAML), _edited(VLLM_YAML), id="vllm-yaml-one-byte-serve"),
    pytest.param("lmspec-vllm", edit_byte(VLLM_YAML), _edited(VLLM_YAML), id="vllm-yaml-one-byte-lmspec-vllm"),
    pytest.param("lmspec-vllm", edit_byte(SERVE_SH), _edited(SERVE_SH), id="serve-sh-one-byte-lmspec-vllm"),
    # -- a build file replaced by something else
    pytest.param("train", truncate(SPEC), _edited(SPEC), id="spec-truncated"),
    pytest.param("serve", write(SPEC, b""), _edited(SPEC), id="spec-empty"),
    pytest.param("verify", delete(SPEC), _refused(SPEC, "is missing"), id="spec-deleted"),
    pytest.param("train", fifo(SPEC), _refused(SPEC, "is a FIFO, not a regular file"), id="spec-fifo"),
    pytest.param("serve", directory(SPEC), _refused(SPEC, "is a directory, not a regular file"), id="spec-directory"),
    pytest.param("train", symlink_to_copy(SPEC), _refused(SPEC, "is a symbolic link"), id="spec-symlink-to-copy"),
    pytest.param("train", write(SPEC, b"\xff\xfe name: tiny\n"), _edited(SPEC), id="spec-not-utf8"),
    pytest.param("convert", write(MAPPING, bytes(range(256)) * 8), _edited(MAPPING), id="mapping-garbage"),
    pytest.param("convert", write(MAPPING, b"[]\n"), _edited(MAPPING), id="mapping-list"),
    pytest.param("convert", fifo(MAPPING), _refused(MAPPING, "is a FIFO"), id="mapping-fifo"),
    pytest.param("train", delete(TORCHRUN), _refused(TORCHRUN, "is missing"), id="torchrun-deleted"),
    pytest.param("train", symlink_loop(TORCHRUN), _refused(TORCHRUN, "is a symbolic link"), id="torchrun-symlink-loop"),
    pytest.param("train", fifo(NCCL), _refused(NCCL, "is a FIFO"), id="nccl-env-fifo"),
    pytest.param(
        "train",
        symlink_to_copy("launch"),
        _refused(TORCHRUN, "launch/ is a symbolic link (links are not followed), not a directory"),
        id="launch-dir-symlink",
    ),
    pytest.param(
        "convert",
        dir_as_file("convert"),
        _refused(MAPPING, "convert/ is a regular file, not a directory"),
        id="convert-dir-file",
    ),
    pytest.param("serve", delete(VLLM_YAML), _refused(VLLM_YAML, "is missing"), id="vllm-yaml-deleted"),
    pytest.param("train", sparse(SPEC, MAX_FILE_BYTES + 1), _refused(SPEC, "more than any build file"), id="spec-huge"),
    pytest.param(
        "lmspec.runtime.verify", fifo(MAPPING), _refused(MAPPING, "is a FIFO"), id="mapping-fifo-runtime-verify"
    ),
    pytest.param(
        "lmspec.runtime.train.loop", delete(NCCL), _refused(NCCL, "is missing"), id="nccl-env-deleted-runtime-train"
    ),
    # -- manifest.json damaged
    pytest.param(
        "lmspec-vllm", dangling(MANIFEST), _manifest("is a symbolic link"), id="manifest-dangling-link-lmspec-vllm"
    ),
    pytest.param(
        "train", delete(MANIFEST), ["build/tiny is not a build directory (no manifest.json)"], id="manifest-deleted"
    ),
    pytest.param("train", fifo(MANIFEST), _manifest("is a FIFO, not a regular file"), id="manifest-fifo"),
    pytest.param("convert", directory(MANIFEST), _manifest("is a directory"), id="manifest-directory"),
    pytest.param("serve", symlink_to_copy(MANIFEST), _manifest("is a symbolic link"), id="manifest-symlink-to-copy"),
    pytest.param(
        "train", write(MANIFEST, bytes(range(256))), _manifest("not a manifest lmspec wrote"), id="manifest-garbage"
    ),
    pytest.param("train", truncate(MANIFEST), _manifest("not a manifest lmspec wrote"), id="manifest-truncated"),
    pytest.param(
        "verify", write(MANIFEST, b"[]"), _manifest("a JSON list where a mapping belongs"), id="manifest-list"
    ),
    pytest.param(
        "train", write(MANIFEST, b"null"), _manifest("a JSON null where a mapping belongs"), id="manifest-null"
    ),
    pytest.param(
        "lmspec.runtime.train.loop",
        write(MANIFEST, b'{"files": NaN}'),
        _manifest("NaN is not a JSON number"),
        id="manifest-nan-runtime-train",
    ),
    pytest.param(
        "train",
        write(MANIFEST, b'{"name": "a", "name": "b"}'),
        _manifest("key 'name' appears twice"),
        id="manifest-dup",
    ),
    pytest.param(
        "train", write(MANIFEST, b"[" * 100_000 + b"]" * 100_000), _manifest("nested too deep"), id="manifest-deep"
    ),
    pytest.param(
        "train",
        write(MANIFEST, b" " * (MAX_MANIFEST_BYTES + 1)),
        _manifest("more than any build file"),
        id="manifest-huge",
    ),
    pytest.param(
        "train", edit_json(MANIFEST, _set("files", [])), _manifest("'files' is not a mapping"), id="manifest-files-list"
    ),
    pytest.param("serve", edit_json(MANIFEST, _pop("files")), _manifest("no 'files' entry"), id="manifest-no-files"),
    pytest.param(
        "train",
        edit_json(MANIFEST, lambda d: d["files"].__setitem__("../victim", "0" * 64)),
        _manifest("not a path inside the build"),
        id="manifest-path-escapes",
    ),
    pytest.param(
        "train",
        edit_json(MANIFEST, _set_file_hash(SPEC)),
        _manifest("'spec_sha256' is not the sha256 'files' gives spec.resolved.yaml"),
        id="manifest-spec-hash-edited",
    ),
    pytest.param(
        "lmspec.runtime.train.loop", edit_json(MANIFEST, _set_file_hash(PLAN)), _edited(PLAN), id="manifest-plan-hash"
    ),
    pytest.param(
        "train", edit_json(MANIFEST, _drop_file(NCCL)), _refused(NCCL, "not listed in manifest.json"), id="unlisted"
    ),
    pytest.param(
        "train",
        edit_json(MANIFEST, _set("lmspec_version", "0.0.1")),
        [f"build/tiny was compiled by lmspec 0.0.1 (manifest.json), this is lmspec {__version__}", RECOMPILE],
        id="manifest-other-version",
    ),
    # -- forged: the manifest rewritten to match the edit, so the schema and shape checks decide
    pytest.param(
        "train",
        replace_text(SPEC, "launcher: local", "launcher: pbs", rehash=True),
        _refused(SPEC, "cluster.launcher=\"pbs\" (build/tiny/spec.resolved.yaml): expected one of 'local', 'slurm'"),
        id="forged-spec-launcher-pbs",
    ),
    pytest.param(
        "lmspec.runtime.train.loop",
        replace_text(SPEC, "steps: 30", "steps: 30.5", rehash=True),
        _refused(SPEC, "train.steps=30.5"),
        id="forged-spec-float-steps",
    ),
    pytest.param(
        "serve",
        replace_text(SPEC, "name: tiny\n", "name: &a tiny\nx: *a\n", rehash=True),
        _refused(SPEC, "YAML anchors and aliases are not written by lmspec"),
        id="forged-spec-alias",
    ),
    pytest.param(
        "train",
        replace_text(SPEC, "name: tiny\n", "name: !!binary aGVsbG8=\n", rehash=True),
        _refused(SPEC, "name holds a YAML bytes, not a spec value"),
        id="forged-spec-binary",
    ),
    pytest.param(
        "verify",
        replace_text(SPEC, "steps: 30", "steps: .nan", rehash=True),
        _refused(SPEC, "train.steps=nan is not a finite number"),
        id="forged-spec-nan",
    ),
    pytest.param(
        "train",
        replace_text(SPEC, "name: tiny\n", "name: other\n", rehash=True),
        _refused(SPEC, "names the job 'other', manifest.json names it 'tiny'"),
        id="forged-spec-renamed",
    ),
    pytest.param(
        "train",
        write(SPEC, b"- a\n- b\n", rehash=True),
        _refused(SPEC, "a YAML list where the spec's mapping belongs"),
        id="forged-spec-list",
    ),
    pytest.param(
        "train", write(SPEC, b"\xff\xfe", rehash=True), _refused(SPEC, "not UTF-8 text"), id="forged-spec-bytes"
    ),
    pytest.param(
        "serve", write(SPEC, b"a: [1\n", rehash=True), _refused(SPEC, "not a YAML spec"), id="forged-spec-bad-yaml"
    ),
    pytest.param(
        "convert",
        write(MAPPING, b"[]", rehash=True),
        _refused(MAPPING, "a JSON list where a mapping belongs"),
        id="forged-mapping-list",
    ),
    pytest.param(
        "lmspec.runtime.convert.to_hf",
        edit_json(MAPPING, _set("tensors", {}), rehash=True),
        _refused(MAPPING, "its 'tensors' entry is missing or not a list"),
        id="forged-mapping-tensors-mapping",
    ),
    pytest.param(
        "convert",
        edit_json(MAPPING, lambda d: d["tensors"][0].__setitem__("kind", "bogus"), rehash=True),
        _refused(MAPPING, "an entry is not one lmspec writes (ValueError: 'bogus' is not a valid SplitKind)"),
        id="forged-mapping-bad-kind",
    ),
    pytest.param(
        "verify",
        write(MAPPING, b'{"output": Infinity}', rehash=True),
        _refused(MAPPING, "Infinity is not a JSON number"),
        id="forged-mapping-infinity",
    ),
    pytest.param(
        "lmspec.runtime.train.loop",
        write(PLAN, b"[1, 2]", rehash=True),
        _refused(PLAN, "a JSON list where a mapping belongs"),
        id="forged-plan-list",
    ),
    pytest.param(
        "lmspec.runtime.train.loop",
        edit_json(PLAN, _pop("layout"), rehash=True),
        _refused(PLAN, "its 'layout' entry is missing or not a dict"),
        id="forged-plan-no-layout",
    ),
    pytest.param(
        "lmspec.runtime.train.loop",
        edit_json(PLAN, lambda d: d["layout"].__setitem__("world_size", 4), rehash=True),
        _refused(PLAN, "its 'layout.world_size' is not what lmspec derives from the spec"),
        id="forged-plan-world-size",
    ),
    pytest.param(
        "serve",
        edit_json(PLAN, lambda d: d["memory"]["stages"][0].__setitem__("layers", 99), rehash=True),
        _refused(PLAN, "its 'memory.stages.0.layers' is not what lmspec derives from the spec"),
        id="forged-plan-stage-layers",
    ),
    pytest.param("serve", edit_byte(PLAN), _edited(PLAN), id="plan-one-byte-serve"),
    pytest.param("lmspec.runtime.verify", edit_byte(PLAN), _edited(PLAN), id="plan-one-byte-runtime-verify"),
    pytest.param(
        "train",
        replace_text(SPEC, "global_batch_size: 16", "global_batch_size: 12", rehash=True),
        # Build.open runs no rules (the runtime never imports them): the forged spec no longer
        # derives the plan.json beside it, and that is what is refused
        _refused(PLAN, "its 'batch.global_batch_size' is not what lmspec derives from the spec"),
        id="forged-spec-breaks-a-rule",
    ),
    # -- the build directory itself
    pytest.param(
        "train",
        lambda build: (shutil.rmtree(build), build.write_text("x")),
        ["build/tiny is not a build directory (not a directory)"],
        id="build-is-a-file",
    ),
    pytest.param(
        "serve",
        lambda build: shutil.rmtree(build),
        ["build/tiny is not a build directory (no such directory)"],
        id="gone",
    ),
]


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pristine")
    write_build(root / BUILD, build_files(make_plan([])))
    return root / BUILD


@pytest.fixture
def workdir(tmp_path: Path, pristine: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory holding a fresh copy of the tiny build at build/tiny."""
    work = tmp_path / "work"
    shutil.copytree(pristine, work / BUILD)
    monkeypatch.chdir(work)
    monkeypatch.delenv("LMSPEC_DEBUG", raising=False)
    return work


@pytest.mark.parametrize("entry,damage,fragments", CASES)
def test_damaged_build_is_refused_naming_the_file(
    entry: str, damage: Damage, fragments: list[str], workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    damage(workdir / BUILD)
    before = snapshot(workdir.parent)
    capsys.readouterr()
    code = ENTRY[entry]()
    err = capsys.readouterr().err
    assert code == 2, err
    for fragment in fragments:
        assert fragment in err, f"missing {fragment!r} in:\n{err}"
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err  # one line
    assert snapshot(workdir.parent) == before  # nothing written, nothing removed, nothing run


@pytest.mark.parametrize("stage", ["train", "convert", "verify", "serve"])
def test_the_intact_build_passes_every_dry_run(
    stage: str, workdir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The refusals above are not a reader that refuses everything."""
    before = snapshot(workdir.parent)
    assert ENTRY[stage]() == 0, capsys.readouterr().err
    assert snapshot(workdir.parent) == before


def test_the_fix_named_for_an_edited_spec_works(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`lmspec compile --spec build/tiny/spec.resolved.yaml -o build` turns the edit into a build."""
    replace_text(SPEC, "port: 8000", "port: 8001")(workdir / BUILD)
    assert ENTRY["serve"]() == 2
    assert lmspec_run(["compile", "--spec", str(BUILD / SPEC), "-o", "build"]) == 0
    capsys.readouterr()
    assert ENTRY["serve"]() == 0, capsys.readouterr().err
