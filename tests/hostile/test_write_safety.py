"""Write safety under hostile targets: `lmspec compile` (plain, --check, -m) and `lmspec run --stage
convert` against whatever already sits where they write.

One case per target state, in the style of Hydra's error tests: the state is set up under
`out/` (the build root), the command runs in-process, and the case asserts the exit code, the
message fragments, no traceback, the exact state of the build root afterwards (unchanged, or
the fresh build and nothing else) and that `victim/`, a directory outside the build root
that symlinks and swept values point at, is exactly as it was.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers.build import compile_build
from helpers.tree import snapshot

LONG_NAME = "n" * 246  # the longest `name` whose sweep index (<name>-sweep.md) fits in 255 bytes
UNCHANGED = "unchanged"


@dataclass
class Ctx:
    root: Path
    out: Path  # the build root (-o)
    victim: Path  # outside -o: must never change
    template: Path  # a tiny build, compiled once

    def build_at(self, path: Path) -> Path:
        """A copy of the tiny build at `path` (an lmspec build in every respect)."""
        shutil.copytree(self.template, path, symlinks=True)
        return path


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return compile_build(tmp_path_factory.mktemp("template")).dir


_REFERENCES: dict[tuple[str, ...], dict[str, str]] = {}


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Callable[[list[str]], dict[str, str]]:
    """The snapshot of a fresh build compiled from `overrides` into an empty root."""

    def get(overrides: list[str]) -> dict[str, str]:
        key = tuple(overrides)
        if key not in _REFERENCES:
            _REFERENCES[key] = snapshot(compile_build(tmp_path_factory.mktemp("reference"), overrides).dir)
        return _REFERENCES[key]

    return get


@pytest.fixture
def ctx(tmp_path: Path, template: Path) -> Ctx:
    out, victim = tmp_path / "out", tmp_path / "victim"
    out.mkdir()
    (victim / "sub").mkdir(parents=True)
    (victim / "precious.txt").write_text("the user's own file\n")
    (victim / "sub" / "notes.md").write_text("more of them\n")
    shutil.copytree(template, victim / "build", symlinks=True)  # a build elsewhere, symlinked to by some cases
    return Ctx(tmp_path, out, victim, template)


# --- target states ---------------------------------------------------------------------------
# Each setup makes out/<target> (or the build root itself) what the case says; returns the -o
# to pass when it is not out/.


def user_dir(c: Ctx) -> None:
    (c.out / "notes" / "drafts").mkdir(parents=True)
    (c.out / "notes" / "todo.txt").write_text("buy milk\n")
    (c.out / "notes" / "drafts" / "a.md").write_text("draft\n")


def empty_dir(c: Ctx) -> None:
    (c.out / "tiny").mkdir()


def regular_file(c: Ctx) -> None:
    (c.out / "tiny").write_text("a file where the build goes\n")


def link_to_dir(c: Ctx) -> None:
    (c.out / "tiny").symlink_to(c.victim)


def link_to_file(c: Ctx) -> None:
    (c.out / "tiny").symlink_to(c.victim / "precious.txt")


def dangling_link(c: Ctx) -> None:
    (c.out / "tiny").symlink_to(c.root / "nowhere")


def link_to_build(c: Ctx) -> None:
    (c.out / "tiny").symlink_to(c.victim / "build")


def fifo_target(c: Ctx) -> None:
    os.mkfifo(c.out / "tiny")


def _build_with(change: Callable[[Path], None]) -> Callable[[Ctx], None]:
    def setup(c: Ctx) -> None:
        change(c.build_at(c.out / "tiny"))

    return setup


def _replace_manifest(make: Callable[[Path], None]) -> Callable[[Ctx], None]:
    def change(build: Path) -> None:
        (build / "manifest.json").unlink()
        make(build / "manifest.json")

    return _build_with(change)


def _many_files(build: Path) -> None:
    for i in range(7):
        (build / f"mine{i}.txt").write_text(f"{i}\n")


def _named_file_as_dir(build: Path) -> None:
    (build / "REPORT.md").unlink()
    (build / "REPORT.md").mkdir()
    (build / "REPORT.md" / "keep.txt").write_text("mine\n")


def _subdir_as_link(c: Ctx) -> None:
    build = c.build_at(c.out / "tiny")
    shutil.rmtree(build / "convert")
    (build / "convert").symlink_to(c.victim / "sub")


def _named_file_as_link(c: Ctx) -> None:
    build = c.build_at(c.out / "tiny")
    (build / "REPORT.md").unlink()
    (build / "REPORT.md").symlink_to(c.victim / "precious.txt")


def _build_plus_link(c: Ctx) -> None:
    (c.build_at(c.out / "tiny") / "data").symlink_to(c.victim)


def out_is_file(c: Ctx) -> Path:
    c.out.rmdir()
    c.out.write_text("not a directory\n")
    return c.out


def out_under_file(c: Ctx) -> Path:
    (c.out / "f").write_text("not a directory\n")
    return c.out / "f" / "sub"


def _leftover(c: Ctx, name: str, make: Callable[[Path], None]) -> None:
    make(c.out / name)


def killed_staging(c: Ctx) -> None:
    """What a compile killed while writing leaves: a staging dir with its marker and part of a build."""
    c.build_at(c.out / "tiny")
    staging = c.out / ".lmspec-0123456789ab"
    staging.mkdir()
    (staging / ".lmspec-staging").write_text("")
    (staging / "REPORT.md").write_text("half of a rep")


def killed_retired(c: Ctx) -> None:
    """What the fallback leaves when killed after the old build went aside: a whole old build at a dot-name."""
    c.build_at(c.out / ".lmspec-a1b2c3d4e5f6")


def killed_index(c: Ctx) -> None:
    c.build_at(c.out / "tiny")
    (c.out / ".lmspec-00000000abcd.part").write_text("")


def user_dot_dirs(c: Ctx) -> None:
    """A user's directories that look like leftovers but hold what lmspec did not write: kept."""
    c.build_at(c.out / "tiny")
    (c.out / ".lmspec-ffffffffffff").mkdir()
    (c.out / ".lmspec-ffffffffffff" / "mine.txt").write_text("mine\n")
    (c.out / ".tiny.old-4242").mkdir()  # the old writer's retired name: never cleaned by this one
    (c.out / ".tiny.old-4242" / "manifest.json").write_text("{}\n")
    (c.out / ".lmspec-eeeeeeeeeeee.part").write_text("a user's file with a leftover's name\n")


def build_hand_edited(c: Ctx) -> None:
    (c.build_at(c.out / "tiny") / "REPORT.md").write_text("edited by hand\n")


def build_file_deleted(c: Ctx) -> None:
    (c.build_at(c.out / "tiny") / "plan.json").unlink()


def build_subdir_deleted(c: Ctx) -> None:
    shutil.rmtree(c.build_at(c.out / "tiny") / "convert")


def nothing(c: Ctx) -> None:
    pass


def long_build(c: Ctx) -> None:
    compile_build(c.out, [f"name={LONG_NAME}", "train.steps=3"])


def sparse(path: Path) -> None:
    with open(path, "wb") as fh:
        fh.truncate(100 << 20)


def fresh(name: str, overrides: list[str], *others: str) -> tuple[str, str, list[str], frozenset[str]]:
    """After: out/<name> is exactly a fresh compile of `overrides`, and out/ holds it and `others` only."""
    return ("fresh", name, overrides, frozenset(others))


NOT_BUILD = "exists and is not an lmspec build"

COMPILE_CASES = [
    pytest.param(user_dir, ["name=notes"], 2, ["notes " + NOT_BUILD, "(no manifest.json)"], UNCHANGED, id="user-dir"),
    pytest.param(empty_dir, [], 2, ["tiny " + NOT_BUILD, "(no manifest.json)"], UNCHANGED, id="empty-dir"),
    pytest.param(regular_file, [], 2, [NOT_BUILD, "(it is a regular file)"], UNCHANGED, id="regular-file"),
    pytest.param(link_to_dir, [], 2, [NOT_BUILD, "(it is a symlink)"], UNCHANGED, id="symlink-to-dir"),
    pytest.param(link_to_file, [], 2, [NOT_BUILD, "(it is a symlink)"], UNCHANGED, id="symlink-to-file"),
    pytest.param(dangling_link, [], 2, [NOT_BUILD, "(it is a symlink)"], UNCHANGED, id="symlink-dangling"),
    pytest.param(link_to_build, [], 2, [NOT_BUILD, "(it is a symlink)"], UNCHANGED, id="symlink-to-build"),
    pytest.param(fifo_target, [], 2, [NOT_BUILD, "(it is a FIFO)"], UNCHANGED, id="fifo-target"),
    pytest.param(
        _replace_manifest(os.mkfifo),
        [],
        2,
        ["manifest.json is a FIFO, not a regular file"],
        UNCHANGED,
        id="manifest-fifo",
    ),
    pytest.param(
        _replace_manifest(os.mkdir),
        [],
        2,
        ["manifest.json is a directory, not a regular file"],
        UNCHANGED,
        id="manifest-dir",
    ),
    pytest.param(
        _replace_manifest(lambda p: p.symlink_to(p.parent.parent.parent / "victim" / "build" / "manifest.json")),
        [],
        2,
        ["manifest.json is a symlink, not a regular file"],
        UNCHANGED,
        id="manifest-symlink",
    ),
    pytest.param(
        _replace_manifest(lambda p: p.write_bytes(b"\xff\xfe{\x00")),
        [],
        2,
        ["manifest.json is not valid JSON"],
        UNCHANGED,
        id="manifest-not-utf8",
    ),
    pytest.param(
        _replace_manifest(lambda p: p.write_text("")),
        [],
        2,
        ["manifest.json is not valid JSON"],
        UNCHANGED,
        id="manifest-empty",
    ),
    pytest.param(
        _replace_manifest(lambda p: p.write_text("[]\n")),
        [],
        2,
        ["manifest.json has no table of the files lmspec wrote"],
        UNCHANGED,
        id="manifest-list",
    ),
    pytest.param(
        _replace_manifest(lambda p: p.write_text('{"files": ["REPORT.md"]}\n')),
        [],
        2,
        ["manifest.json has no table of the files lmspec wrote"],
        UNCHANGED,
        id="manifest-files-not-a-table",
    ),
    pytest.param(
        _replace_manifest(sparse), [], 2, ["manifest.json is 104857600 bytes, more than"], UNCHANGED, id="manifest-huge"
    ),
    pytest.param(
        _build_with(lambda b: (b / "notes.txt").write_text("mine\n")),
        [],
        2,
        [NOT_BUILD, "it holds notes.txt, which manifest.json does not name"],
        UNCHANGED,
        id="build-plus-user-file",
    ),
    pytest.param(
        _build_with(lambda b: (b / ".env").write_text("SECRET=1\n")),
        [],
        2,
        ["it holds .env, which manifest.json does not name"],
        UNCHANGED,
        id="build-plus-dotfile",
    ),
    pytest.param(
        _build_with(lambda b: (b / "mine").mkdir() or (b / "mine" / "x").write_text("x\n")),
        [],
        2,
        ["it holds mine/, which manifest.json does not name"],
        UNCHANGED,
        id="build-plus-user-dir",
    ),
    pytest.param(
        _build_with(lambda b: (b / "convert" / "notes.txt").write_text("mine\n")),
        [],
        2,
        ["it holds convert/notes.txt, which"],
        UNCHANGED,
        id="build-plus-file-in-subdir",
    ),
    pytest.param(
        _build_with(lambda b: os.mkfifo(b / "pipe")),
        [],
        2,
        ["it holds pipe (a FIFO), which"],
        UNCHANGED,
        id="build-plus-fifo",
    ),
    pytest.param(_build_plus_link, [], 2, ["it holds data (a symlink), which"], UNCHANGED, id="build-plus-symlink"),
    pytest.param(
        _build_with(_named_file_as_dir), [], 2, ["it holds REPORT.md/, which"], UNCHANGED, id="named-file-is-user-dir"
    ),
    pytest.param(
        _named_file_as_link, [], 2, ["it holds REPORT.md (a symlink), which"], UNCHANGED, id="named-file-is-link"
    ),
    pytest.param(_subdir_as_link, [], 2, ["it holds convert (a symlink), which"], UNCHANGED, id="subdir-is-link"),
    pytest.param(
        _build_with(_many_files),
        [],
        2,
        ["mine0.txt, mine1.txt, mine2.txt, mine3.txt, mine4.txt and 2 more"],
        UNCHANGED,
        id="build-plus-many",
    ),
    pytest.param(out_is_file, [], 2, ["cannot inspect", "Not a directory"], UNCHANGED, id="out-is-file"),
    pytest.param(out_under_file, [], 2, ["cannot inspect", "Not a directory"], UNCHANGED, id="out-under-file"),
    pytest.param(
        _build_with(lambda b: None), ["parallel.tp=4"], 1, ["error: parallel."], UNCHANGED, id="invalid-spec-over-build"
    ),
    pytest.param(nothing, [], 0, [], fresh("tiny", []), id="new"),
    pytest.param(build_hand_edited, [], 0, [], fresh("tiny", []), id="hand-edited-build-replaced"),
    pytest.param(build_file_deleted, [], 0, [], fresh("tiny", []), id="partial-build-replaced"),
    pytest.param(build_subdir_deleted, [], 0, [], fresh("tiny", []), id="subdir-deleted-build-replaced"),
    pytest.param(
        _build_with(lambda b: None), ["train.steps=9"], 0, [], fresh("tiny", ["train.steps=9"]), id="build-replaced"
    ),
    pytest.param(nothing, [f"name={LONG_NAME}"], 0, [], fresh(LONG_NAME, [f"name={LONG_NAME}"]), id="name-246-new"),
    pytest.param(
        long_build, [f"name={LONG_NAME}"], 0, [], fresh(LONG_NAME, [f"name={LONG_NAME}"]), id="name-246-replaced"
    ),
    pytest.param(killed_staging, [], 0, [], fresh("tiny", []), id="leftover-staging-cleaned"),
    pytest.param(killed_retired, [], 0, [], fresh("tiny", []), id="leftover-retired-build-cleaned"),
    pytest.param(killed_index, [], 0, [], fresh("tiny", []), id="leftover-part-cleaned"),
    pytest.param(
        user_dot_dirs,
        [],
        0,
        [],
        fresh("tiny", [], ".lmspec-ffffffffffff", ".tiny.old-4242", ".lmspec-eeeeeeeeeeee.part"),
        id="user-dot-names-kept",
    ),
]


def _assert_after(
    c: Ctx, before: dict[str, str], after: object, reference: Callable[[list[str]], dict[str, str]]
) -> None:
    if after == UNCHANGED:
        assert snapshot(c.out) == before
        return
    if callable(after):
        after(c)
        return
    _, name, overrides, others = after  # type: ignore[misc]
    assert snapshot(c.out / name) == reference(overrides)
    assert set(os.listdir(c.out)) == {name} | others
    for other in others:  # what was kept is kept exactly
        kept = {k.removeprefix(f"{other}/"): v for k, v in before.items() if k.startswith(f"{other}/")}
        assert snapshot(c.out / other) == kept | {".": before[other]}


def _run_case(lmspec, c: Ctx, setup, args, code, fragments, after, reference, *command: str) -> None:  # type: ignore[no-untyped-def]
    made = setup(c)
    output = made if isinstance(made, Path) else c.out
    before, victim_before = snapshot(c.out), snapshot(c.victim)
    result = lmspec(*command, "-o", str(output), *args)
    result.assert_reports(code, fragments)
    assert snapshot(c.victim) == victim_before
    _assert_after(c, before, after, reference)


@pytest.mark.parametrize(("setup", "args", "code", "fragments", "after"), COMPILE_CASES)
def test_compile_target(lmspec, ctx: Ctx, reference, setup, args, code, fragments, after) -> None:  # type: ignore[no-untyped-def]
    _run_case(lmspec, ctx, setup, args, code, fragments, after, reference, "compile")


# --- sweeps ----------------------------------------------------------------------------------


def _only_direct_builds(c: Ctx, names: dict[str, str]) -> None:
    """out/ holds exactly these builds (name -> the swept override it stands for) and the index."""
    assert set(os.listdir(c.out)) == set(names) | {"tiny-sweep.md"}
    index = (c.out / "tiny-sweep.md").read_text()
    for name, override in names.items():
        assert "/" not in name and (c.out / name / "manifest.json").is_file()
        manifest = json.loads((c.out / name / "manifest.json").read_text())
        assert override in manifest["overrides"]
        assert f"| [{name}](<{name}/REPORT.md>) | {override} |" in index


def swept_path_names(c: Ctx) -> None:
    _only_direct_builds(
        c,
        {
            "tiny-serve.served_model_name=.._.._.._victim-80326016": "serve.served_model_name=../../../victim",
            "tiny-serve.served_model_name=x": "serve.served_model_name=x",
        },
    )


def swept_checkpoint_dirs(c: Ctx) -> None:
    _only_direct_builds(
        c,
        {
            "tiny-train.checkpoint.dir=a_b-c26b9c41": "train.checkpoint.dir=a/b",
            "tiny-train.checkpoint.dir=c": "train.checkpoint.dir=c",
        },
    )


def swept_long_name(c: Ctx) -> None:
    names = sorted(os.listdir(c.out))
    assert len(names) == 3 and f"{LONG_NAME}-sweep.md" in names
    assert all(len(n) == 255 and n.startswith(LONG_NAME + "-") for n in names if not n.endswith("-sweep.md"))


def sweep_point_user_dir(c: Ctx) -> None:
    (c.out / "tiny-train.steps=2" / "mine").mkdir(parents=True)


def sweep_index_user_file(c: Ctx) -> None:
    (c.out / "tiny-sweep.md").write_text("my own notes about tiny\n")


def sweep_index_dir(c: Ctx) -> None:
    (c.out / "tiny-sweep.md").mkdir()


def sweep_index_link(c: Ctx) -> None:
    (c.out / "tiny-sweep.md").symlink_to(c.victim / "precious.txt")


SWEEP_CASES = [
    pytest.param(
        nothing, ["-m", "serve.served_model_name=../../../victim,x"], 0, [], swept_path_names, id="sweep-dotdot-value"
    ),
    pytest.param(nothing, ["-m", "train.checkpoint.dir=a/b,c"], 0, [], swept_checkpoint_dirs, id="sweep-slash-value"),
    pytest.param(nothing, ["-m", f"name={LONG_NAME}", "train.steps=1,2"], 0, [], swept_long_name, id="sweep-name-246"),
    pytest.param(
        sweep_point_user_dir,
        ["-m", "train.steps=1,2"],
        2,
        ["tiny-train.steps=2 " + NOT_BUILD, "(no manifest.json)"],
        UNCHANGED,  # refused before the first build is written: not even train.steps=1
        id="sweep-point-is-user-dir",
    ),
    pytest.param(
        sweep_index_user_file,
        ["-m", "train.steps=1,2"],
        2,
        ["tiny-sweep.md exists and lmspec did not write it", "does not start with '# Sweep: '"],
        UNCHANGED,
        id="sweep-index-is-user-file",
    ),
    pytest.param(
        sweep_index_dir,
        ["-m", "train.steps=1,2"],
        2,
        ["tiny-sweep.md exists and lmspec did not write it", "a directory"],
        UNCHANGED,
        id="sweep-index-is-dir",
    ),
    pytest.param(
        sweep_index_link,
        ["-m", "train.steps=1,2"],
        2,
        ["tiny-sweep.md exists and lmspec did not write it", "a symlink"],
        UNCHANGED,
        id="sweep-index-is-symlink",
    ),
    pytest.param(
        nothing,
        ["-m", "train.steps=1,1"],
        2,
        ["would both be built as", "list each combination once"],
        UNCHANGED,
        id="sweep-duplicate",
    ),
]


@pytest.mark.parametrize(("setup", "args", "code", "fragments", "after"), SWEEP_CASES)
def test_sweep_target(lmspec, ctx: Ctx, reference, setup, args, code, fragments, after) -> None:  # type: ignore[no-untyped-def]
    _run_case(lmspec, ctx, setup, args, code, fragments, after, reference, "compile")


# --- compile --check: reading whatever is there never hangs or crashes ------------------------


def _check_build(change: Callable[[Path], None]) -> Callable[[Ctx], None]:
    return _build_with(change)


def _swap_for(rel: str, make: Callable[[Path], None]) -> Callable[[Path], None]:
    def change(build: Path) -> None:
        (build / rel).unlink()
        make(build / rel)

    return change


def _unreadable(build: Path) -> None:
    (build / "REPORT.md").chmod(0)


def user_dir_at_target(c: Ctx) -> None:
    (c.out / "tiny").mkdir()
    (c.out / "tiny" / "notes.txt").write_text("x\n")


CHECK_CASES = [
    pytest.param(_check_build(lambda b: None), [], 0, [], UNCHANGED, id="check-fresh"),
    pytest.param(
        _check_build(_swap_for("manifest.json", os.mkfifo)),
        [],
        1,
        ["manifest.json (a FIFO, not a regular file)"],
        UNCHANGED,
        id="check-manifest-fifo",
    ),
    pytest.param(
        _check_build(_swap_for("REPORT.md", lambda p: p.write_bytes(b"\xff\xfe\xfd"))),
        [],
        1,
        ["REPORT.md (changed)"],
        UNCHANGED,
        id="check-not-utf8",
    ),
    pytest.param(
        _check_build(_swap_for("REPORT.md", os.mkdir)),
        [],
        1,
        ["REPORT.md (a directory, not a regular file)"],
        UNCHANGED,
        id="check-dir-for-file",
    ),
    pytest.param(
        _check_build(_swap_for("REPORT.md", lambda p: p.symlink_to("plan.json"))),
        [],
        1,
        ["REPORT.md (a symlink, not a regular file)"],
        UNCHANGED,
        id="check-symlink-for-file",
    ),
    pytest.param(
        _check_build(_swap_for("REPORT.md", sparse)),
        [],
        1,
        ["REPORT.md (104857600 bytes, more than"],
        UNCHANGED,
        id="check-huge-file",
    ),
    pytest.param(
        _check_build(_swap_for("report/memory.svg", os.mkfifo)),  # the chart an earlier build offers for reuse
        [],
        1,
        ["report/memory.svg (a FIFO, not a regular file)"],
        UNCHANGED,
        id="check-chart-fifo",
    ),
    pytest.param(
        _check_build(lambda b: os.mkfifo(b / "pipe")), [], 1, ["pipe (not emitted)"], UNCHANGED, id="check-extra-fifo"
    ),
    pytest.param(
        _check_build(_unreadable),
        [],
        1,
        ["REPORT.md (unreadable: Permission denied)"],
        UNCHANGED,
        id="check-unreadable",
        marks=pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file of mode 000"),
    ),
    pytest.param(
        user_dir_at_target,
        [],
        1,
        ["manifest.json (missing)", "notes.txt (not emitted)"],
        UNCHANGED,
        id="check-user-dir",
    ),
    pytest.param(
        link_to_build, [], 2, ["tiny is a symlink, not a build directory"], UNCHANGED, id="check-symlink-target"
    ),
    pytest.param(
        regular_file, [], 2, ["tiny is a regular file, not a build directory"], UNCHANGED, id="check-file-target"
    ),
    pytest.param(fifo_target, [], 2, ["tiny is a FIFO, not a build directory"], UNCHANGED, id="check-fifo-target"),
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("setup", "args", "code", "fragments", "after"), CHECK_CASES)
def test_check_target(lmspec, ctx: Ctx, reference, setup, args, code, fragments, after) -> None:  # type: ignore[no-untyped-def]
    _run_case(lmspec, ctx, setup, args, code, fragments, after, reference, "compile", "--check")


# --- lmspec run --stage convert: the converter replaces only what it wrote ---------------------


def run_dir(c: Ctx) -> None:
    """What `convert.output=runs/tiny` pointed at: the run's checkpoints and metrics."""
    (c.out / "hf" / "checkpoints" / "step_00000002").mkdir(parents=True)
    (c.out / "hf" / "checkpoints" / "latest").write_text("step_00000002\n")
    (c.out / "hf" / "checkpoints" / "step_00000002" / "model.pt").write_bytes(b"\x00" * 64)
    (c.out / "hf" / "metrics.jsonl").write_text('{"step": 1, "loss": 3.2}\n')


def converted_plus_user_file(c: Ctx) -> None:
    (c.out / "hf").mkdir()
    (c.out / "hf" / "config.json").write_text("{}\n")
    (c.out / "hf" / "lmspec-convert.json").write_text('{"files": {"config.json": 3}}\n')
    (c.out / "hf" / "notes.txt").write_text("mine\n")


def marker_fifo(c: Ctx) -> None:
    (c.out / "hf").mkdir()
    os.mkfifo(c.out / "hf" / "lmspec-convert.json")


def a_build_there(c: Ctx) -> None:
    c.build_at(c.out / "hf")


def link_output(c: Ctx) -> None:
    (c.out / "hf").symlink_to(c.victim)


def file_output(c: Ctx) -> None:
    (c.out / "hf").write_text("weights.bin\n")


NOT_CONVERTED = "exists and is not a model lmspec's converter wrote"
CONVERT_CASES = [
    pytest.param(run_dir, 2, ["convert.output=", NOT_CONVERTED, "(no lmspec-convert.json)"], id="convert-over-run-dir"),
    pytest.param(link_output, 2, ["convert.output=", NOT_CONVERTED, "(it is a symlink)"], id="convert-over-symlink"),
    pytest.param(file_output, 2, ["convert.output=", NOT_CONVERTED, "(it is a regular file)"], id="convert-over-file"),
    pytest.param(a_build_there, 2, ["convert.output=", "(no lmspec-convert.json)"], id="convert-over-build"),
    pytest.param(
        converted_plus_user_file,
        2,
        ["convert.output=", "it holds notes.txt, which lmspec-convert.json does not name"],
        id="convert-over-own-output-plus-user-file",
    ),
    pytest.param(
        marker_fifo,
        2,
        ["convert.output=", "lmspec-convert.json is a FIFO, not a regular file"],
        id="convert-marker-fifo",
    ),
    pytest.param(
        nothing, 2, ["ckpt: no checkpoint; train first"], id="convert-new-output-nothing-made-before-the-checkpoint"
    ),
]


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("setup", "code", "fragments"), CONVERT_CASES)
def test_convert_output(lmspec, ctx: Ctx, setup, code, fragments) -> None:  # type: ignore[no-untyped-def]
    builds = ctx.root / "builds"
    overrides = [f"convert.output={ctx.out / 'hf'}", f"train.checkpoint.dir={ctx.root / 'ckpt'}"]
    assert lmspec("compile", "-o", str(builds), *overrides).code == 0
    setup(ctx)
    before, victim_before = snapshot(ctx.out), snapshot(ctx.victim)
    result = lmspec("run", str(builds / "tiny"), "--stage", "convert")
    result.assert_reports(code, fragments)
    assert snapshot(ctx.out) == before
    assert snapshot(ctx.victim) == victim_before
