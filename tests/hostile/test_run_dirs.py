"""Run directories are owned: conversion output, checkpoint dir and run dir stay apart (a rule, and
the runtime's own check); a run's checkpoints carry its run id; resume=never moves an earlier run's
checkpoints aside (never deletes them); keep_last_k prunes only the current run's checkpoints.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers.tree import snapshot

from lmspec.compiler.build.files import PREVIOUS_RUNS, STEP_MANIFEST
from lmspec.compiler.build.writer import write_build
from lmspec.compiler.emit.manifest import build_files
from lmspec.compiler.pipeline import make_plan
from lmspec.runtime.train.checkpoint import CheckpointError, Checkpoints, dir_run_id
from lmspec.runtime.train.loop import main as train_main

TRAIN_DEFAULTS = Path(__file__).parents[2] / "specs" / "train" / "default.yaml"
CKPT_LINE = TRAIN_DEFAULTS.read_text().splitlines().index("  dir: runs/${name}/checkpoints") + 1
CKPT = f'train.checkpoint.dir="runs/tiny/checkpoints" (lmspec:specs/train/default.yaml:{CKPT_LINE})'
RUN = 'the run directory runs/tiny/ of name="tiny"'
CONVERT_HARM = "replaces convert.output as a whole and would delete"

# One case per input: overrides ({cwd} = the working directory), expected exit, message fragments.
RULE_CASES = [
    pytest.param(
        ["convert.output=runs/tiny"],
        1,
        ['convert.output="runs/tiny" (command-line override) is the same directory as ' + RUN, CONVERT_HARM],
        id="output-is-run-dir",
    ),
    pytest.param(
        ["convert.output=${train.checkpoint.dir}"],
        1,
        ['convert.output="runs/tiny/checkpoints"', "is the same directory as " + CKPT, "would delete every checkpoint"],
        id="output-interpolates-checkpoint-dir",
    ),
    pytest.param(
        ["convert.output=."],
        1,
        [
            'convert.output="." (command-line override) contains ' + RUN,
            "contains " + CKPT,
            "use convert.output=runs/tiny/hf",
        ],
        id="output-is-working-dir",
    ),
    pytest.param(
        ["convert.output=./runs/tiny/"],
        1,
        ["is the same directory as " + RUN, "both resolve to {cwd}/runs/tiny)"],
        id="output-dot-slash-trailing-slash",
    ),
    pytest.param(
        ["convert.output=runs/x/../tiny/hf/.."],
        1,
        ['convert.output="runs/x/../tiny/hf/.."', "is the same directory as " + RUN],
        id="output-dotdot",
    ),
    pytest.param(
        ["convert.output={cwd}/runs/tiny/checkpoints/"],
        1,
        ["is the same directory as " + CKPT, "both resolve to {cwd}/runs/tiny/checkpoints"],
        id="output-absolute-equals-relative-checkpoint-dir",
    ),
    pytest.param(
        ["convert.output=runs/tiny/checkpoints/hf"],
        1,
        ["is inside " + CKPT, "the conversion would write among the checkpoints", "use convert.output=runs/tiny/hf"],
        id="output-inside-checkpoint-dir",
    ),
    pytest.param(
        ["convert.output=runs"],
        1,
        ["contains " + CKPT, "contains " + RUN, "with everything in it"],
        id="output-contains-run-dir",
    ),
    pytest.param(
        ["convert.output=runs/tiny/metrics.jsonl"],
        1,
        ["is the run's metrics.jsonl in " + RUN, "would delete the run's metrics.jsonl"],
        id="output-is-metrics-jsonl",
    ),
    pytest.param(
        ["convert.output=runs/tiny/tokenizer/hf"],
        1,
        ["is inside the run's tokenizer in " + RUN],
        id="output-inside-serve-tokenizer",
    ),
    pytest.param(
        ["train.checkpoint.dir=runs/tiny/"],
        1,
        [
            'train.checkpoint.dir="runs/tiny/" (command-line override) is the same directory as ' + RUN,
            "use train.checkpoint.dir=runs/tiny/checkpoints",
            'convert.output="runs/tiny/hf" (lmspec:specs/convert/default.yaml:5) is inside train.checkpoint.dir',
        ],
        id="checkpoint-dir-is-run-dir",
    ),
    pytest.param(
        ["train.checkpoint.dir=."],
        1,
        ['train.checkpoint.dir="." (command-line override) contains ' + RUN, "must hold only checkpoints"],
        id="checkpoint-dir-is-working-dir",
    ),
    pytest.param(
        ["train.checkpoint.dir=runs/tiny/vllm_cache/ck"],
        1,
        ["is inside the run's vllm_cache in " + RUN],
        id="checkpoint-dir-in-vllm-cache",
    ),
    pytest.param(
        ["train.checkpoint.dir=runs/tiny/hf/ck"],
        1,
        ['convert.output="runs/tiny/hf" (lmspec:specs/convert/default.yaml:5) contains train.checkpoint.dir='],
        id="checkpoint-dir-inside-output",
    ),
    pytest.param(
        ["train.checkpoint.dir={cwd}/runs/tiny/hf"],
        1,
        ["is the same directory as train.checkpoint.dir=", "(command-line override)"],
        id="checkpoint-dir-absolute-equals-output",
    ),
    pytest.param(
        ["serve.model_path=runs/tiny/checkpoints/step_10"],
        1,
        ['serve.model_path="runs/tiny/checkpoints/step_10" (command-line override) is inside ' + CKPT, "keep_last_k"],
        id="model-path-inside-checkpoints",
    ),
    pytest.param(
        ["serve.model_path=./runs/tiny/checkpoints/"],
        1,
        ["is the same directory as " + CKPT, "serve.model_path=null"],
        id="model-path-is-checkpoint-dir",
    ),
    pytest.param(
        ["name=other", "convert.output=runs/other"],
        1,
        ['is the same directory as the run directory runs/other/ of name="other" (command-line override)'],
        id="output-is-renamed-run-dir",
    ),
    pytest.param(
        ["convert.output=runs/tiny/alias"],  # runs/tiny/alias -> checkpoints (made by the test)
        1,
        ["is the same directory as " + CKPT, "both resolve to {cwd}/runs/tiny/checkpoints"],
        id="output-symlink-to-checkpoint-dir",
    ),
    pytest.param(
        ["--spec", "llama3_8b_pretrain_8gpu_h100_bf16", "convert.output=runs/llama3_8b_pretrain_8gpu_h100_bf16"],
        1,
        ["is the same directory as the run directory runs/llama3_8b_pretrain_8gpu_h100_bf16/"],
        id="preset-output-is-run-dir",
    ),
    # accepted: apart, or inside the run directory as the presets put them
    pytest.param([], 0, [], id="defaults"),
    pytest.param(["convert.output=runs/tinyx"], 0, [], id="name-prefix-is-not-containment"),
    pytest.param(["convert.output=runs/tiny/checkpoints2"], 0, [], id="checkpoint-dir-prefix-is-not-containment"),
    pytest.param(["train.checkpoint.dir={cwd}/elsewhere/ck"], 0, [], id="checkpoint-dir-absolute-apart"),
    pytest.param(["serve.model_path=runs/tiny/hf"], 0, [], id="model-path-is-conversion-output"),
    pytest.param(["serve.model_path=runs/tiny"], 0, [], id="model-path-contains-checkpoints-is-read-only"),
]


@pytest.mark.parametrize(("overrides", "code", "fragments"), RULE_CASES)
def test_run_directories_may_not_overlap(
    lmspec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, overrides: list[str], code: int, fragments: list[str]
) -> None:
    cwd = tmp_path.resolve()
    (cwd / "runs" / "tiny" / "checkpoints").mkdir(parents=True)
    (cwd / "runs" / "tiny" / "alias").symlink_to("checkpoints")
    monkeypatch.chdir(cwd)
    result = lmspec("check", *(o.replace("{cwd}", str(cwd)) for o in overrides))
    result.assert_reports(code, [f.replace("{cwd}", str(cwd)) for f in fragments])
    if code:
        errors = [line for line in result.err.splitlines() if line.startswith("error:")]
        keys = ("convert.output=", "train.checkpoint.dir=", "serve.model_path=", "name=")
        assert errors and all(sum(k in e for k in keys) >= 2 for e in errors), errors  # each names both keys


@pytest.mark.usefixtures("runtime_logging")  # as `python -m lmspec.runtime.train` sets it up first
def test_runtime_repeats_the_check_from_its_own_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Compiled in A, apart there; started in B, where the absolute convert.output is the run directory."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    monkeypatch.chdir(a)
    build = a / "build" / "tiny"
    write_build(build, build_files(make_plan([f"convert.output={b}/runs/tiny"])))
    monkeypatch.chdir(b)
    before = snapshot(b)
    assert train_main([str(build)]) == 2
    err = capsys.readouterr().err
    assert f'convert.output="{b}/runs/tiny" is the same directory as the run directory runs/tiny/' in err
    assert f"(working directory {b})" in err and "recompile the build" in err and "Traceback" not in err
    assert snapshot(b) == before


# -- run identity, resume=never, keep_last_k -----------------------------------------------------


def _save(ckpts: Checkpoints, step: int) -> Path:
    tmp = ckpts.begin_save(step)
    (tmp / "trainer_state").mkdir()
    (tmp / "trainer_state" / "rank_0.pt").write_bytes(f"{ckpts.run_id}:{step}".encode())
    final = ckpts.commit(step, tmp)
    ckpts.join_pruning()  # the steps beyond keep_last_k are removed by a thread
    return final


def _run(root: Path, resume: str, steps: tuple[int, ...], keep: int = 2) -> Checkpoints:
    ckpts = Checkpoints(root, keep_last_k=keep, required=("trainer_state/rank_0.pt",))
    resumed = ckpts.open_run(resume)  # type: ignore[arg-type]
    for step in steps:
        _save(ckpts, step)
    ckpts.resumed = resumed  # type: ignore[attr-defined]
    return ckpts


def _steps(root: Path) -> dict[str, str]:
    """step dir -> the run id in its manifest."""
    return {
        p.name: json.loads((p / STEP_MANIFEST).read_text()).get("run_id")
        for p in sorted(root.iterdir())
        if p.name.startswith("step_")
    }


def test_resume_never_moves_the_old_run_aside_and_prunes_only_its_own(tmp_path: Path) -> None:
    root = tmp_path / "ck"
    old = _run(root, "auto", (2, 4, 6, 8))  # keeps step_6, step_8
    (root / "notes.txt").write_text("the user's")
    before = snapshot(root)
    new = _run(root, "never", (2, 4, 6))
    assert new.run_id != old.run_id and new.resumed is None
    moved = root / PREVIOUS_RUNS / old.run_id
    after = snapshot(moved)
    expected = {k: v for k, v in before.items() if k not in (".", "notes.txt")}
    assert {k: v for k, v in after.items() if k != "."} == expected  # exact: nothing of the old run changed
    assert (root / "notes.txt").read_text() == "the user's"  # not lmspec's: left in place
    assert _steps(root) == {"step_4": new.run_id, "step_6": new.run_id}
    assert (root / "latest").read_text() == "step_6\n" and dir_run_id(root) == new.run_id
    again = _run(root, "auto", ())
    assert again.resumed == root / "step_6" and again.run_id == new.run_id
    assert {k: v for k, v in snapshot(moved).items() if k != "."} == expected


def test_the_bug_resume_never_below_an_old_runs_higher_steps(tmp_path: Path) -> None:
    """Before run ids: keep_last_k kept the old run's step_100/200 and pruned the new step_2; latest dangled."""
    root = tmp_path / "ck"
    old = _run(root, "auto", (100, 200))
    new = _run(root, "never", (2,))
    assert _steps(root) == {"step_2": new.run_id}
    assert _steps(root / PREVIOUS_RUNS / old.run_id) == {"step_100": old.run_id, "step_200": old.run_id}
    resumed = _run(root, "auto", ())
    assert resumed.resumed == root / "step_2" and resumed.run_id == new.run_id


def test_keep_last_k_prunes_only_the_current_runs_checkpoints(tmp_path: Path) -> None:
    """A directory that holds another run's steps anyway (copied in): they are neither pruned nor overwritten."""
    other = _run(tmp_path / "other", "auto", (4, 100))
    root = tmp_path / "ck"
    ckpts = Checkpoints(root, keep_last_k=2, required=("trainer_state/rank_0.pt",))
    assert ckpts.open_run("never") is None
    for name in ("step_4", "step_100"):
        shutil.copytree(tmp_path / "other" / name, root / name)
    foreign = {name: snapshot(root / name) for name in ("step_4", "step_100")}
    for step in (2, 4, 6, 8):
        _save(ckpts, step)
    assert _steps(root) == {"step_100": other.run_id, "step_6": ckpts.run_id, "step_8": ckpts.run_id}
    assert snapshot(root / "step_100") == foreign["step_100"]
    aside = root / PREVIOUS_RUNS / other.run_id / "step_4"  # stood where this run's step_4 went
    assert snapshot(aside) == foreign["step_4"]


def test_run_id_is_kept_across_resumes_and_written_to_every_manifest(tmp_path: Path) -> None:
    root = tmp_path / "ck"
    first = _run(root, "auto", (2,), keep=5)
    second = _run(root, "auto", (4,), keep=5)
    third = _run(root, "auto", (6,), keep=5)
    assert first.run_id == second.run_id == third.run_id == dir_run_id(root)
    assert set(_steps(root).values()) == {first.run_id}
    assert second.resumed == root / "step_2" and third.resumed == root / "step_4"


def test_checkpoints_without_run_id_count_as_the_run_that_resumes_them(tmp_path: Path) -> None:
    """Manifests from before run ids: resuming from one adopts them, so keep_last_k still prunes them."""
    root = tmp_path / "ck"
    _run(root, "auto", (2, 4, 6), keep=5)
    for step_dir in root.glob("step_*"):
        doc = json.loads((step_dir / STEP_MANIFEST).read_text())
        del doc["run_id"]
        (step_dir / STEP_MANIFEST).write_text(json.dumps(doc))
    resumed = _run(root, "auto", (8,), keep=2)
    assert resumed.resumed == root / "step_6"
    assert _steps(root) == {"step_6": None, "step_8": resumed.run_id}


def test_resume_never_twice_and_unidentified_runs_get_their_own_names(tmp_path: Path) -> None:
    root = tmp_path / "ck"
    first = _run(root, "auto", (2,))
    second = _run(root, "never", (2,))
    _run(root, "never", (2,))
    assert sorted(p.name for p in (root / PREVIOUS_RUNS).iterdir()) == sorted([first.run_id, second.run_id])
    for name in ("unidentified", "unidentified-2"):  # no readable manifest: still never deleted
        (root / "step_2" / STEP_MANIFEST).write_text("garbage")
        _run(root, "never", (2,))
        assert (root / PREVIOUS_RUNS / name / "step_2" / STEP_MANIFEST).read_text() == "garbage"


def test_resume_never_that_cannot_move_is_a_clean_error_and_moves_nothing(tmp_path: Path) -> None:
    root = tmp_path / "ck"
    _run(root, "auto", (2,))
    (root / PREVIOUS_RUNS).write_text("in the way")  # mkdir of previous_runs/<id> fails
    before = snapshot(root)
    with pytest.raises(CheckpointError, match=r"train.checkpoint.dir=.*: Not a directory.*compile with another"):
        Checkpoints(root, keep_last_k=1).open_run("never")
    assert snapshot(root) == before


# -- end to end: torchrun, resume=never over an old run's checkpoints ----------------------------

NAME = "rundirs"
COMMON = [f"name={NAME}", "train.checkpoint.interval=2", "train.checkpoint.keep_last_k=2", "train.log_interval=1"]


@pytest.mark.slow
def test_resume_never_over_an_old_run_end_to_end(tmp_path: Path) -> None:
    from helpers.build import compile_build
    from helpers.torchrun import run

    work = tmp_path / "work"
    work.mkdir()
    ckpt = work / "runs" / NAME / "checkpoints"
    old_build = compile_build(tmp_path / "old" / "build", [*COMMON, "train.steps=6"]).dir
    old = run(old_build, work)
    assert old.code == 0, old.output[-4000:]
    old_id = dir_run_id(ckpt)
    assert old_id and (ckpt / "latest").read_text() == "step_6\n"
    before = snapshot(ckpt)

    fresh_build = compile_build(
        tmp_path / "fresh" / "build", [*COMMON, "train.steps=4", "train.checkpoint.resume=never"]
    ).dir
    fresh = run(fresh_build, work)
    assert fresh.code == 0, fresh.output[-4000:]
    moved = ckpt / PREVIOUS_RUNS / old_id
    assert "train.checkpoint.resume=never: moved the checkpoints of the previous run" in fresh.output
    assert str(Path("runs") / NAME / "checkpoints" / PREVIOUS_RUNS / old_id) in fresh.output
    expected = {k: v for k, v in before.items() if k != "."}
    assert {k: v for k, v in snapshot(moved).items() if k != "."} == expected
    new_id = dir_run_id(ckpt)
    assert new_id and new_id != old_id
    assert _steps(ckpt) == {"step_2": new_id, "step_4": new_id}  # neither pruned by the old run's higher steps
    assert (ckpt / "latest").read_text() == "step_4\n"

    auto_build = compile_build(tmp_path / "auto" / "build", [*COMMON, "train.steps=6"]).dir
    resumed = run(auto_build, work)
    assert resumed.code == 0, resumed.output[-4000:]
    assert f"resumed from runs/{NAME}/checkpoints/step_4 (step 4); run {new_id}" in resumed.output
    assert _steps(ckpt) == {"step_4": new_id, "step_6": new_id}
    assert {k: v for k, v in snapshot(moved).items() if k != "."} == expected


def test_a_fresh_run_starts_its_own_metrics_file(tmp_path: Path) -> None:
    """resume=never (or no checkpoint to resume) begins a new metrics.jsonl; earlier runs' lines are renamed
    to metrics.previous-<n>.jsonl, never appended to or deleted. A resumed run appends."""
    from lmspec.runtime.train.metrics import MetricsLog

    plan = make_plan([])
    spec, numbers = (
        plan.spec,
        {"tokens_per_step": plan.trained().batch.tokens_per_step, "flops_per_token": plan.trained().flops.per_token},
    )
    (tmp_path / "metrics.jsonl").write_text('{"step": 10}\n')
    (tmp_path / "metrics.previous-1.jsonl").write_text('{"step": 5}\n')
    MetricsLog(spec, tmp_path, 2, True, 30, 0, fresh_run=True, **numbers).close()
    assert not (tmp_path / "metrics.jsonl").exists()
    assert (tmp_path / "metrics.previous-1.jsonl").read_text() == '{"step": 5}\n'
    assert (tmp_path / "metrics.previous-2.jsonl").read_text() == '{"step": 10}\n'
    (tmp_path / "metrics.jsonl").write_text('{"step": 20}\n')
    MetricsLog(spec, tmp_path, 2, True, 30, 20, fresh_run=False, **numbers).close()
    assert (tmp_path / "metrics.jsonl").read_text() == '{"step": 20}\n'
