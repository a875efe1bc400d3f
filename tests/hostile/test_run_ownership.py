"""A run owns its directories (issue 46): a checkpoint directory is resumed only by a build of its run's
identity; two `lmspec run` of one build exclude each other; the trainers die with `lmspec run`; SIGINT and
SIGTERM checkpoint and leave no temporary directory, and print no traceback.

One tiny build trains twice, each time as the user runs it (`lmspec run`, real processes): the first run is
stopped with SIGINT while a second `lmspec run` of the same build is refused; the second resumes and its
`lmspec run` is SIGKILLed. The identity refusals read the checkpoints those runs left.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers.build import compile_build
from helpers.cli import LMSPEC
from helpers.processes import default_sigint
from helpers.tree import snapshot

from lmspec.compiler.build.files import STEP_MANIFEST
from lmspec.compiler.errors import UsageError
from lmspec.compiler.pipeline import make_plan
from lmspec.runtime.process_group import EXIT_SIGINT
from lmspec.runtime.train.checkpoint import AnotherRun, Checkpoints, dir_run_id
from lmspec.runtime.train.ownership import LOCK_FILE, RunLock, refuse_another_run, run_identity

TRAIN = ["train.steps=400", "train.checkpoint.interval=4", "train.checkpoint.keep_last_k=2", "train.log_interval=1"]
CKPT = Path("runs/tiny/checkpoints")
STARTED_S = 180  # a tiny 2-rank launch reaches its first checkpoint in ~20 s; a loaded CI machine is slower
GONE_S = 30  # every process of a stopped or orphaned run has ended by then (the stop's grace)


def _latest(cwd: Path) -> int:
    latest = cwd / CKPT / "latest"
    return int(latest.read_text().strip().removeprefix("step_")) if latest.is_file() else 0


def _start_time(pid: int) -> str | None:
    """The process's start time (its identity with the pid), None once it is gone or a zombie."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return None if fields[0] in ("Z", "X") else fields[19]


def _tree(root: int) -> dict[int, str]:
    """Every living descendant of `root`, and root itself: pid -> start time."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rpartition(")")[2].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found, todo = {}, [root]
    while todo:
        pid = todo.pop()
        if (started := _start_time(pid)) is not None:
            found[pid] = started
        todo += [child for child, parent in parents.items() if parent == pid]
    return found


def _alive(tree: dict[int, str]) -> list[int]:
    return [pid for pid, started in tree.items() if _start_time(pid) == started]


def _kill(tree: dict[int, str]) -> None:
    for pid in _alive(tree):
        os.kill(pid, signal.SIGKILL)


@dataclass
class Launch:
    proc: subprocess.Popen[bytes]
    log: Path
    tree: dict[int, str]

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def _launch(cwd: Path, build: Path, log: str) -> Launch:
    with open(cwd / log, "wb") as fh:
        proc = subprocess.Popen(
            [LMSPEC, "run", str(build)],
            cwd=cwd,
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=default_sigint,
        )
    return Launch(proc, cwd / log, {})


def _until_step_after(launch: Launch, cwd: Path, step: int) -> None:
    """Wait until a checkpoint newer than `step` is committed, then record the launch's process tree."""
    deadline = time.monotonic() + STARTED_S
    while _latest(cwd) <= step:
        assert launch.proc.poll() is None and time.monotonic() < deadline, launch.output()[-4000:]
        time.sleep(0.1)
    launch.tree = _tree(launch.proc.pid)


def _gone_within(tree: dict[int, str], seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while (alive := _alive(tree)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return alive


@dataclass
class Runs:
    cwd: Path
    build: Path
    first: Launch
    first_code: int
    first_stopped_at: int  # the newest checkpoint when SIGINT was sent
    first_saved: int  # the newest checkpoint once the first run stopped
    second: subprocess.CompletedProcess[str]
    run_id: str | None
    launches_during_second: int
    tmp_left_by_stop: list[str]
    alive_after_stop: list[int]
    killed: Launch
    killed_from: int
    alive_after_kill: list[int]
    stale_tmp_left: bool


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    cwd = tmp_path_factory.mktemp("ownership")
    build = compile_build(cwd / "build", TRAIN).dir
    launches: list[Launch] = []
    try:
        first = _launch(cwd, build, "first.log")
        launches.append(first)
        _until_step_after(first, cwd, 0)
        run_id = dir_run_id(cwd / CKPT)
        second = subprocess.run(
            [LMSPEC, "run", str(build)], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
        )
        launches_during_second = len(list((cwd / "runs" / "tiny" / "rank_logs").iterdir()))
        stopped_at = _latest(cwd)
        first.proc.send_signal(signal.SIGINT)  # Ctrl-C
        first_code = first.proc.wait(timeout=GONE_S + 30)
        alive_after_stop = _gone_within(first.tree, GONE_S)
        tmp_left_by_stop = sorted(p.name for p in (cwd / CKPT).glob(".tmp-*"))
        first_saved = _latest(cwd)

        stale = cwd / CKPT / ".tmp-step_1000"  # a save a kill -9 interrupted: reclaimed by the next save
        (stale / "torch_dist").mkdir(parents=True)
        (stale / "torch_dist" / "__0_0.distcp").write_bytes(b"partial")
        killed_from = _latest(cwd)
        killed = _launch(cwd, build, "killed.log")
        launches.append(killed)
        _until_step_after(killed, cwd, killed_from)
        stale_tmp_left = stale.exists()
        killed.proc.kill()  # the OOM killer, or a terminal closed under it
        killed.proc.wait()
        alive_after_kill = _gone_within(killed.tree, GONE_S)
        yield Runs(
            cwd,
            build,
            first,
            first_code,
            stopped_at,
            first_saved,
            second,
            run_id,
            launches_during_second,
            tmp_left_by_stop,
            alive_after_stop,
            killed,
            killed_from,
            alive_after_kill,
            stale_tmp_left,
        )
    finally:
        for launch in launches:
            _kill(launch.tree or _tree(launch.proc.pid))
            if launch.proc.poll() is None:
                launch.proc.kill()
                launch.proc.wait()


# -- two runs of one build ----------------------------------------------------------------------


@pytest.mark.slow
def test_a_second_run_of_the_build_is_refused_at_once_and_touches_nothing(runs: Runs) -> None:
    second = runs.second
    assert second.returncode == 2, second.stdout + second.stderr
    lines = second.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in second.stderr + second.stdout, second.stderr
    line = lines[0]
    first_pid = runs.first.proc.pid
    assert line.startswith("lmspec: error: the run directory runs/tiny/ of name=tiny is in use by another lmspec run")
    assert f"(pid {first_pid} on {socket.gethostname()}, since 20" in line
    assert f"lock runs/tiny/{LOCK_FILE}" in line and "wait for it to end or stop it" in line
    assert runs.launches_during_second == 1  # the second started no torchrun (a launch is a rank_logs folder)
    manifests = [json.loads(p.read_text()) for p in (runs.cwd / CKPT).glob(f"step_*/{STEP_MANIFEST}")]
    assert {m["run_id"] for m in manifests} == {runs.run_id}  # no second run id among the checkpoints


def test_a_lock_whose_holder_died_never_blocks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The lock is the kernel's: a lock file a dead holder left (it stays) is taken at once; a live holder
    (here another descriptor of this process) refuses, naming itself and the checkpoint directory."""
    monkeypatch.chdir(tmp_path)
    spec = make_plan(["train.checkpoint.dir=elsewhere/ck"]).spec
    (tmp_path / "elsewhere" / "ck").mkdir(parents=True)
    (tmp_path / "elsewhere" / "ck" / LOCK_FILE).write_text('{"pid": 999999, "host": "gone", "since": "then"}')
    with RunLock(spec, Path("runs/tiny")):
        other = RunLock(spec, Path("runs/other"))
        with pytest.raises(
            UsageError, match=r"^train.checkpoint.dir=elsewhere/ck is in use by another lmspec run"
        ) as e:
            other.__enter__()
        assert f"(pid {os.getpid()} on {socket.gethostname()}, since " in str(e.value)
        assert other.fds == []  # the run directory's lock it took first is released
    with RunLock(spec, Path("runs/other")):
        pass


# -- stops --------------------------------------------------------------------------------------


@pytest.mark.slow
def test_ctrl_c_checkpoints_and_leaves_nothing_running_or_half_written(runs: Runs) -> None:
    output = runs.first.output()
    assert runs.first_code == EXIT_SIGINT, output[-4000:]
    assert "Traceback" not in output and "SignalException" not in output and "BrokenPipeError" not in output
    saved = runs.first_saved
    assert saved > runs.first_stopped_at  # the stop saved a step of its own
    assert output.splitlines()[-2:] == [
        "lmspec run: SIGINT: the trainers checkpoint and stop",
        f"lmspec run: stopped by SIGINT; checkpointed at step {saved} ({CKPT}/step_{saved}): "
        f"`lmspec run {runs.build}` resumes from it",
    ]
    assert runs.tmp_left_by_stop == []
    assert runs.alive_after_stop == []


@pytest.mark.slow
def test_sigkill_of_lmspec_run_stops_every_trainer(runs: Runs) -> None:
    """Nothing trains on with nobody watching: the agent dies with `lmspec run`, each trainer checkpoints when
    its agent dies, and every process of the launch (trainers and their checkpoint helpers) ends."""
    assert runs.alive_after_kill == [], [Path(f"/proc/{p}/cmdline").read_bytes() for p in runs.alive_after_kill]
    assert len(runs.killed.tree) >= 4  # lmspec run, torchrun, two trainers (and the trainers' helpers)
    assert "resumed from runs/tiny/checkpoints/step_" in runs.killed.output()
    assert not runs.stale_tmp_left  # the killed save of an earlier run was reclaimed by this run's first save
    assert sorted(p.name for p in (runs.cwd / CKPT).glob(".tmp-*")) == []
    assert dir_run_id(runs.cwd / CKPT) == runs.run_id  # one run across the stop, the resume and the kill


# -- identity -----------------------------------------------------------------------------------

REFUSED = [
    pytest.param(
        ["train.seed=7", "train.optimizer.lr=1e-3", "train.steps=30"],
        ["train.seed is 7 here but 1234 there"],
        id="seed-lr-steps",
    ),
    pytest.param(
        ["model.ffn_hidden_size=256"],
        ["model.ffn_hidden_size is 256 here but 512 there"],
        id="model-shape",
    ),
    pytest.param(
        ["train.optimizer.name=sgd"], ['train.optimizer.name is "sgd" here but "adamw" there'], id="optimizer"
    ),
    pytest.param(
        ["train.data.sources=[{path: data/other_text_document, weight: 1.0}]"],
        ['train.data.sources is [{"path": "data/other_text_document", "weight": 1.0}] here but null there'],
        id="data",
    ),
]


@pytest.mark.slow
@pytest.mark.parametrize(("overrides", "fragments"), REFUSED)
def test_a_build_of_another_identity_never_resumes_the_directory(
    runs: Runs, overrides: list[str], fragments: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Refused before anything starts or is written; the message names the directory, each key with both
    values, and the fixes (the check `lmspec run` makes first; the next test runs it whole)."""
    monkeypatch.chdir(runs.cwd)
    before = snapshot(runs.cwd / CKPT)
    with pytest.raises(UsageError) as refused:
        refuse_another_run(make_plan([*TRAIN, *overrides]).spec)
    message = str(refused.value)
    assert message.startswith(f"train.checkpoint.dir='{CKPT}' holds the checkpoints of another run (step_")
    assert f"of run {runs.run_id}):" in message and "\n" not in message
    for fragment in [*fragments, "compile with another train.checkpoint.dir", "train.checkpoint.resume=never"]:
        assert fragment in message, message
    assert "train.optimizer.lr" not in message and "train.steps" not in message  # a resume may change those
    assert snapshot(runs.cwd / CKPT) == before


@pytest.mark.slow
def test_lmspec_run_refuses_another_identity_in_one_line(runs: Runs) -> None:
    other = compile_build(runs.cwd / "other", [*TRAIN, "train.seed=7", "model.ffn_hidden_size=256"]).dir
    before = snapshot(runs.cwd / CKPT)
    done = subprocess.run([LMSPEC, "run", str(other)], cwd=runs.cwd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert "model.ffn_hidden_size is 256 here but 512 there; train.seed is 7 here but 1234 there" in done.stderr
    assert snapshot(runs.cwd / CKPT) == before


@pytest.mark.slow
def test_a_build_of_the_same_identity_resumes(runs: Runs, monkeypatch: pytest.MonkeyPatch) -> None:
    """The learning rate, the steps and the layout may change across a resume (the layout is resume_layout's)."""
    monkeypatch.chdir(runs.cwd)
    refuse_another_run(make_plan([*TRAIN, "train.optimizer.lr=1e-2", "train.steps=900"]).spec)
    refuse_another_run(make_plan([*TRAIN, "train.seed=7", "train.checkpoint.resume=never"]).spec)


def _save(ckpts: Checkpoints, step: int) -> None:
    tmp = ckpts.begin_save(step)
    (tmp / "trainer_state").mkdir()
    (tmp / "trainer_state" / "rank_0.pt").write_bytes(b"state")
    ckpts.commit(step, tmp)
    ckpts.join_pruning()


def test_the_trainer_refuses_another_identity_too(tmp_path: Path) -> None:
    """A launch that bypasses `lmspec run` (torchrun.sh by hand, Slurm): open_run judges the step it chose."""
    ours = run_identity(make_plan([]).spec)
    first = Checkpoints(tmp_path, keep_last_k=2, required=("trainer_state/rank_0.pt",), identity=ours)
    first.open_run("auto")
    for step in (2, 4):
        _save(first, step)
    before = snapshot(tmp_path)
    theirs = {**ours, "train.seed": 7}
    with pytest.raises(AnotherRun, match=r"train.seed is 7 here but 1234 there; this build never resumes it"):
        Checkpoints(tmp_path, keep_last_k=2, required=("trainer_state/rank_0.pt",), identity=theirs).open_run("auto")
    assert snapshot(tmp_path) == before
    again = Checkpoints(tmp_path, keep_last_k=2, required=("trainer_state/rank_0.pt",), identity=ours)
    assert again.open_run("auto") == tmp_path / "step_4" and again.run_id == first.run_id
    legacy = Checkpoints(tmp_path, keep_last_k=2, required=("trainer_state/rank_0.pt",))  # records no identity
    assert legacy.open_run("auto") == tmp_path / "step_4"
