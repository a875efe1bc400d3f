"""Damaged checkpoint directories: each damage is "not usable, trying the previous one" with a one-line
warning naming the file, never a crash or a hang; with nothing usable left, a clean CheckpointError.

The directories are real ones, written by lmspec.runtime.train.checkpoint's own save protocol (steps 2, 4, 6,
`latest` = step_6), then damaged; the resume-candidate logic (`choose`) runs on them directly.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
import xxhash

from lmspec.compiler.build.files import STEP_MANIFEST
from lmspec.runtime.train.checkpoint import CheckpointError, Checkpoints, choose

STATE = "trainer_state/rank_0.pt"
REQUIRED = (STATE,)
STEPS = (2, 4, 6)


def _write_run(root: Path) -> Checkpoints:
    ckpts = Checkpoints(root, keep_last_k=len(STEPS), required=REQUIRED)
    for step in STEPS:
        tmp = ckpts.begin_save(step)
        (tmp / "torch_dist").mkdir()
        (tmp / "torch_dist" / "__0_0.distcp").write_bytes(b"weights" + bytes([step]))
        (tmp / "trainer_state").mkdir()
        (tmp / STATE).write_bytes(b"state" + bytes([step]))
        ckpts.commit(step, tmp)
        ckpts.join_pruning()
    return ckpts


def _manifest(root: Path, step: int) -> dict:
    return json.loads((root / f"step_{step}" / STEP_MANIFEST).read_text())


def _set_manifest(root: Path, step: int, doc: object) -> None:
    (root / f"step_{step}" / STEP_MANIFEST).write_text(json.dumps(doc))


def _edit_manifest(step: int, edit: Callable[[dict], None]) -> Callable[[Path], None]:
    def damage(root: Path) -> None:
        doc = _manifest(root, step)
        edit(doc)
        _set_manifest(root, step, doc)

    return damage


def _latest_bytes(data: bytes) -> Callable[[Path], None]:
    return lambda root: (root / "latest").write_bytes(data)


def _latest_dir(root: Path) -> None:
    (root / "latest").unlink()
    (root / "latest").mkdir()


def _latest_symlink_out(root: Path) -> None:
    outside = root.parent / "elsewhere"
    outside.write_text("step_2\n")
    (root / "latest").unlink()
    (root / "latest").symlink_to(outside)


def _latest_fifo(root: Path) -> None:
    (root / "latest").unlink()
    os.mkfifo(root / "latest")


def _step_is_file(root: Path) -> None:
    import shutil

    shutil.rmtree(root / "step_6")
    (root / "step_6").write_text("not a directory")


def _step_is_symlink(root: Path) -> None:
    (root / "step_6").rename(root.parent / "moved_step")
    (root / "step_6").symlink_to(root.parent / "moved_step")


def _newer_step_file(root: Path) -> None:
    (root / "step_8").write_bytes(b"\x00" * 10)
    (root / "latest").write_text("step_8\n")


def _manifest_dir(root: Path) -> None:
    (root / "step_6" / STEP_MANIFEST).unlink()
    (root / "step_6" / STEP_MANIFEST).mkdir()


def _manifest_fifo(root: Path) -> None:
    (root / "step_6" / STEP_MANIFEST).unlink()
    os.mkfifo(root / "step_6" / STEP_MANIFEST)


def _listed_symlink_out(root: Path) -> None:
    """A listed file replaced by a symlink to an outside file with the very same bytes (hash matches)."""
    victim = root / "step_6" / "torch_dist" / "__0_0.distcp"
    outside = root.parent / "outside.distcp"
    outside.write_bytes(victim.read_bytes())
    victim.unlink()
    victim.symlink_to(outside)


def _listed_fifo(root: Path) -> None:
    victim = root / "step_6" / "torch_dist" / "__0_0.distcp"
    victim.unlink()
    os.mkfifo(victim)


def _outside_listed(rel: str) -> Callable[[Path], None]:
    def damage(root: Path) -> None:
        doc = _manifest(root, 6)
        doc["files"][rel] = xxhash.xxh3_128(b"").hexdigest()
        _set_manifest(root, 6, doc)

    return damage


def _drop_required(doc: dict) -> None:
    del doc["files"][STATE]


def _latest_and_newest_broken(root: Path) -> None:
    (root / "latest").write_bytes(b"\xff\xfe garbage")
    (root / "step_6" / STEP_MANIFEST).write_text("[1, 2]")


def _latest_names_older_broken(root: Path) -> None:
    (root / "latest").write_text("step_4\n")
    (root / "step_4" / STEP_MANIFEST).write_text("{")


def _case(damage: Callable[[Path], None], step: int, fragments: list[str], id: str):  # noqa: A002
    return pytest.param(damage, step, fragments, id=id)


CASES = [
    # -- garbage `latest`: skipped, the step directories newest first --------------------------
    _case(_latest_bytes(b"\x00\x01\xff\xfe" * 8), 6, ["latest is not text"], "latest-binary"),
    _case(_latest_bytes(b"step_2" * 200_000), 6, ["latest is 1200000 bytes, not a step name"], "latest-huge"),
    _case(_latest_dir, 6, ["latest is not a regular file"], "latest-directory"),
    _case(_latest_symlink_out, 6, ["latest is a symlink"], "latest-symlink-out-of-dir"),
    _case(_latest_fifo, 6, ["latest is not a regular file"], "latest-fifo-no-hang"),
    _case(_latest_bytes(b"../x\n"), 6, ["latest holds '../x', not a step name"], "latest-dotdot"),
    _case(_latest_bytes(b"/etc/passwd"), 6, ["latest holds '/etc/passwd'"], "latest-absolute"),
    _case(_latest_bytes(b""), 6, ["latest holds ''"], "latest-empty"),
    _case(_latest_bytes("step_\u0663".encode()), 6, ["latest is not text"], "latest-arabic-digit"),
    _case(_latest_bytes(b"step_04\n"), 6, ["latest holds 'step_04'"], "latest-leading-zero"),
    _case(_latest_bytes(b"step_9\n"), 6, ["latest names step_9, which does not exist"], "latest-names-missing-step"),
    # -- a bad step manifest: that step is skipped, the previous one used ------------------------
    _case(lambda r: _set_manifest(r, 6, [1, 2]), 4, ["holds a JSON list, not an object"], "manifest-list"),
    _case(lambda r: _set_manifest(r, 6, "step_6"), 4, ["holds a JSON str, not an object"], "manifest-string"),
    _case(lambda r: (r / "step_6" / STEP_MANIFEST).write_text("{not json"), 4, ["is not JSON"], "manifest-not-json"),
    _case(lambda r: (r / "step_6" / STEP_MANIFEST).write_bytes(b"\xff\xfe{}"), 4, ["is not UTF-8"], "manifest-binary"),
    _case(
        lambda r: (r / "step_6" / STEP_MANIFEST).write_text("[" * 100_000 + "]" * 100_000),
        4,
        ["is not JSON"],
        "manifest-nested-100k",
    ),
    _case(_edit_manifest(6, lambda d: d.pop("files")), 4, ["lacks 'files'"], "manifest-missing-files"),
    _case(_edit_manifest(6, lambda d: d.pop("step")), 4, ["lacks 'step'"], "manifest-missing-step"),
    _case(_edit_manifest(6, lambda d: d.update(step="6")), 4, ["'step' is '6', not an integer"], "step-string"),
    _case(_edit_manifest(6, lambda d: d.update(step=True)), 4, ["'step' is True, not an integer"], "step-bool"),
    _case(_edit_manifest(6, lambda d: d.update(step=7)), 4, ["'step' is 7 but the directory is step_6"], "step-other"),
    _case(_edit_manifest(6, lambda d: d.update(files=[STATE])), 4, ["'files' is ["], "files-list"),
    _case(_edit_manifest(6, lambda d: d.update(files={})), 4, ["'files' is {}"], "files-empty"),
    _case(
        _edit_manifest(6, lambda d: d["files"].update({STATE: 12})), 4, ["the xxh3_128 of 'trainer_state"], "digest-int"
    ),
    _case(
        _edit_manifest(6, lambda d: d["files"].update({STATE: "XYZ"})),
        4,
        ["the xxh3_128 of", "is 'XYZ'"],
        "digest-junk",
    ),
    _case(_edit_manifest(6, lambda d: d.update(run_id="../../x")), 4, ["'run_id' is '../../x'"], "run-id-path"),
    _case(_edit_manifest(6, lambda d: d.update(run_id=5)), 4, ["'run_id' is 5, not a run id"], "run-id-int"),
    _case(_edit_manifest(6, _drop_required), 4, ["does not list trainer_state/rank_0.pt"], "manifest-lacks-state"),
    _case(_manifest_dir, 4, ["manifest.json is not a regular file"], "manifest-directory"),
    _case(_manifest_fifo, 4, ["manifest.json is not a regular file"], "manifest-fifo-no-hang"),
    # -- listed paths outside the step directory -------------------------------------------------
    _case(
        _outside_listed("../../etc/passwd"),
        4,
        ["lists '../../etc/passwd', which points outside the step directory"],
        "listed-dotdot",
    ),
    _case(_outside_listed("/etc/passwd"), 4, ["lists '/etc/passwd', which points outside"], "listed-absolute"),
    _case(_outside_listed("torch_dist/./x"), 4, ["lists 'torch_dist/./x'"], "listed-dot-component"),
    _case(_outside_listed("a\nb"), 4, ["lists 'a\\nb', which is not a plain relative path"], "listed-newline"),
    _case(_outside_listed(STEP_MANIFEST), 4, ["which is the manifest itself"], "listed-manifest"),
    _case(_listed_symlink_out, 4, ["__0_0.distcp leads outside", "(a symlink)"], "listed-symlink-out"),
    _case(_listed_fifo, 4, ["__0_0.distcp is not a regular file"], "listed-fifo-no-hang"),
    # -- step entries that are not directories ---------------------------------------------------
    _case(_step_is_file, 4, ["step_6 is not a directory"], "step-is-file"),
    _case(_step_is_symlink, 4, ["step_6 is a symlink, not a step directory lmspec wrote"], "step-is-symlink"),
    _case(_newer_step_file, 6, ["step_8 is not a directory"], "newer-step-is-file"),
    # -- several at once -------------------------------------------------------------------------
    _case(_latest_and_newest_broken, 4, ["latest is not text", "holds a JSON list"], "latest-and-newest-broken"),
    _case(_latest_names_older_broken, 6, ["step_4 is not usable", "is not JSON"], "latest-names-broken-older"),
]


@pytest.mark.parametrize(("damage", "step", "fragments"), CASES)
def test_damaged_checkpoint_is_skipped_with_one_line_warning(
    tmp_path: Path, damage: Callable[[Path], None], step: int, fragments: list[str]
) -> None:
    root = tmp_path / "ck"
    run_id = _write_run(root).run_id
    damage(root)
    choice = choose(root, REQUIRED)
    assert choice.error is None, choice.error
    assert choice.path == root / f"step_{step}"
    assert choice.run_id == run_id
    text = "\n".join(choice.warnings)
    for fragment in fragments:
        assert fragment in text, f"missing {fragment!r} in {choice.warnings}"
    assert choice.warnings and all("\n" not in w and str(root) in w for w in choice.warnings)


@pytest.mark.parametrize(
    ("damage", "fragments"),
    [
        pytest.param(
            lambda r: [(r / f"step_{s}" / STEP_MANIFEST).write_text("[]") for s in STEPS],
            ["step_2 is not usable", "none verifies; refusing to start from scratch", "train.checkpoint.resume=never"],
            id="every-manifest-broken",
        ),
        pytest.param(
            lambda r: [(r / f"step_{s}" / "trainer_state" / "rank_0.pt").write_bytes(b"x") for s in STEPS],
            ["rank_0.pt does not match its xxh3_128", "none verifies"],
            id="every-step-corrupt",
        ),
        pytest.param(
            lambda r: [__import__("shutil").rmtree(r / f"step_{s}") for s in STEPS],
            ["latest names step_6, which does not exist", "none verifies"],
            id="latest-names-deleted-step",
        ),
    ],
)
@pytest.mark.usefixtures("runtime_logging")
def test_nothing_usable_left_is_a_clean_checkpoint_error(
    tmp_path: Path, damage: Callable[[Path], None], fragments: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "ck"
    _write_run(root)
    damage(root)
    with pytest.raises(CheckpointError) as raised:
        Checkpoints(root, keep_last_k=3, required=REQUIRED).open_run("auto")
    text = capsys.readouterr().err + str(raised.value)
    for fragment in fragments:
        assert fragment in text, text
    assert "Traceback" not in text


def test_checkpoint_dir_that_is_a_file_is_an_error_naming_the_key(tmp_path: Path) -> None:
    root = tmp_path / "ck"
    root.write_text("a file")
    with pytest.raises(CheckpointError, match="train.checkpoint.dir=.* is not a directory"):
        Checkpoints(root, keep_last_k=1).open_run("auto")
    assert root.read_text() == "a file"


def test_save_replaces_a_latest_directory_by_moving_it_aside(tmp_path: Path) -> None:
    root = tmp_path / "ck"
    ckpts = _write_run(root)
    _latest_dir(root)
    (root / "latest" / "keep.txt").write_text("mine")
    tmp = ckpts.begin_save(8)
    (tmp / "trainer_state").mkdir()
    (tmp / STATE).write_bytes(b"s")
    ckpts.commit(8, tmp)
    ckpts.join_pruning()
    assert (root / "latest").read_text() == "step_8\n"
    moved = list((root / "previous_runs").glob("*/latest/keep.txt"))
    assert [p.read_text() for p in moved] == ["mine"]


@pytest.mark.usefixtures("runtime_logging")
def test_later_stages_get_the_same_answer_without_torch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """newest_checkpoint (for convert and verify): resume's choice and warnings; no checkpoint is a clean error."""
    import subprocess
    import sys

    from lmspec.runtime.train.checkpoint import newest_checkpoint

    root = tmp_path / "ck"
    _write_run(root)
    (root / "latest").write_bytes(b"\x00garbage")
    assert newest_checkpoint(root, REQUIRED) == root / "step_6"
    assert "latest holds '\\x00garbage'" in capsys.readouterr().err
    with pytest.raises(CheckpointError, match="no checkpoint; train first"):
        newest_checkpoint(tmp_path / "absent")
    code = "import sys, lmspec.runtime.train.checkpoint; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_later_stages_check_presence_not_hashes(tmp_path: Path) -> None:
    """convert/verify take the checkpoint whose files are all there without re-hashing them (a conversion reads
    every byte once; resume hashes): a flipped byte is resume's to catch, a missing file is everyone's."""
    from lmspec.runtime.train.checkpoint import choose, newest_checkpoint

    root = tmp_path / "ck"
    _write_run(root)
    step = root / "step_6"
    victim = next(p for p in sorted(step.rglob("*")) if p.is_file() and p.name != "manifest.json")
    data = bytearray(victim.read_bytes())
    data[0] ^= 0xFF
    victim.write_bytes(bytes(data))
    assert choose(root, REQUIRED).path != step
    assert newest_checkpoint(root, REQUIRED) == step
    victim.unlink()
    assert newest_checkpoint(root, REQUIRED) != step
