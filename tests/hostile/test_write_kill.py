"""A writer killed at any instant leaves the old or the new build, and the next compile cleans up.

`write_build` runs in a forked child that SIGKILLs itself just before its n-th call that
changes the disk (os.open creating a file, mkdir, chmod, rename, replace, unlink, rmdir and
the renameat2 of compiler/build/atomic.py), for n = 1, 2, ... until a run completes: every state
between two such calls is a state a kill can leave. After each kill the target must be exactly the old or
exactly the new build (with renameat2), or, in the fallback's window between its two
renames, missing with the old build whole under a `.lmspec-` dot-name; then an ordinary
write_build must succeed and leave the build root holding the build and nothing else.
Also: real `lmspec compile` processes killed at random moments, and concurrent compiles.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers.build import compile_build
from helpers.cli import LMSPEC
from helpers.tree import snapshot

from lmspec.compiler.build import atomic
from lmspec.compiler.build.writer import write_build
from lmspec.compiler.emit.manifest import build_files
from lmspec.compiler.pipeline import make_plan

# The calls that change what is on disk (os.open only when it creates): a kill before each
# one is a kill in each state the directory passes through.
CALLS = ("open", "mkdir", "chmod", "rename", "replace", "unlink", "rmdir")


@pytest.fixture(scope="module")
def two_builds() -> tuple[dict[str, str], dict[str, str]]:
    return build_files(make_plan([])), build_files(make_plan(["train.steps=9", "parallel.tp=2"]))


def killed_at(n: int, action: Callable[[], None], exchange: bool) -> bool:
    """Run `action` in a child killed just before its n-th file-system call; True if it was killed."""
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            count = [0]
            real_open = os.open

            def counted(function: Callable[..., Any]) -> Callable[..., Any]:
                def call(*args: Any, **kwargs: Any) -> Any:
                    creates = function is not real_open or (len(args) > 1 and args[1] & os.O_CREAT)
                    if creates:
                        count[0] += 1
                        if count[0] == n:
                            os.kill(os.getpid(), signal.SIGKILL)
                    return function(*args, **kwargs)

                return call

            for name in CALLS:
                setattr(os, name, counted(getattr(os, name)))
            # A file system without renameat2 (the documented fallback) answers "not offered".
            atomic._renameat2 = counted(atomic._renameat2 if exchange else lambda source, destination, flags: False)
            action()
            os._exit(0)
        except BaseException:
            os._exit(3)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        assert os.WTERMSIG(status) == signal.SIGKILL
        return True
    assert os.WEXITSTATUS(status) == 0, "the writer failed instead of being killed"
    return False


def _leftovers(out: Path) -> dict[str, dict[str, str]]:
    return {p.name: snapshot(p) for p in out.iterdir() if p.name.startswith(".lmspec-")}


def _has_exchange(directory: Path) -> bool:
    (directory / "a").mkdir()
    (directory / "b").mkdir()
    try:
        return atomic._renameat2(directory / "a", directory / "b", atomic.RENAME_EXCHANGE)
    finally:
        (directory / "a").rmdir()
        (directory / "b").rmdir()


@pytest.mark.parametrize(
    ("existing", "exchange"),
    [
        pytest.param(True, True, id="replace-renameat2"),
        pytest.param(True, False, id="replace-fallback", marks=pytest.mark.slow),
        pytest.param(False, True, id="new-renameat2", marks=pytest.mark.slow),
        pytest.param(False, False, id="new-fallback", marks=pytest.mark.slow),
    ],
)
def test_a_kill_at_any_point_leaves_the_old_or_the_new_build(
    tmp_path: Path, two_builds: tuple[dict[str, str], dict[str, str]], exchange: bool, existing: bool
) -> None:
    if exchange and not _has_exchange(tmp_path):
        pytest.skip("this file system has no renameat2(RENAME_EXCHANGE)")
    old_files, new_files = two_builds
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious.txt").write_text("the user's\n")
    write_build(tmp_path / "reference" / "old", old_files)
    write_build(tmp_path / "reference" / "new", new_files)
    old, new = snapshot(tmp_path / "reference" / "old"), snapshot(tmp_path / "reference" / "new")
    victim_state = snapshot(victim)
    in_window = 0
    n = 0
    killed = True
    while killed:
        n += 1
        out = tmp_path / "out"
        out.mkdir()
        if existing:
            shutil.copytree(tmp_path / "reference" / "old", out / "tiny")
        killed = killed_at(n, lambda out=out: write_build(out / "tiny", new_files), exchange)
        state = snapshot(out / "tiny")
        if existing and state == {}:  # only in the fallback's window: the old build waits whole at a dot-name
            assert not exchange, f"kill {n}: no build at all"
            assert old in _leftovers(out).values(), f"kill {n}: the old build is nowhere"
            in_window += 1
        else:
            assert state in ((old, new) if existing else ({}, new)), f"kill {n}: neither the old nor the new build"
        assert snapshot(victim) == victim_state
        write_build(out / "tiny", new_files)  # the next compile succeeds and cleans what the killed one left
        assert sorted(os.listdir(out)) == ["tiny"], f"kill {n}: leftovers not cleaned"
        assert snapshot(out / "tiny") == new
        shutil.rmtree(out)
    assert n > 20  # every file-system call of a write was a kill point
    assert in_window == (1 if existing and not exchange else 0)


@pytest.mark.slow
def test_real_compiles_killed_at_random_moments(tmp_path: Path) -> None:
    """`lmspec compile` processes SIGKILLed at random times never leave the build root without a build."""
    out = tmp_path / "out"
    command = [LMSPEC, "compile", "-o", str(out)]
    assert subprocess.run(command, capture_output=True, timeout=120).returncode == 0
    states = [snapshot(out / "tiny")]
    assert subprocess.run(command + ["train.steps=9"], capture_output=True, timeout=120).returncode == 0
    states.append(snapshot(out / "tiny"))
    rng = random.Random(14)
    for i in range(12):
        process = subprocess.Popen(command + ([] if i % 2 else ["train.steps=9"]), stderr=subprocess.PIPE)
        time.sleep(rng.uniform(0.5, 3.0))
        process.kill()
        _, err = process.communicate(timeout=60)
        assert b"Traceback" not in err
        assert snapshot(out / "tiny") in states, f"round {i}: the build is neither the old nor the new one"
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert sorted(os.listdir(out)) == ["tiny"] and snapshot(out / "tiny") == states[0]


@pytest.mark.slow
def test_concurrent_compiles_into_one_build_all_succeed(tmp_path: Path) -> None:
    """Six compiles at once into one build root: each waits for the root's lock; one whole build remains."""
    out = tmp_path / "out"
    command = [LMSPEC, "compile", "-o", str(out)]
    processes = [
        subprocess.Popen(command + [f"train.steps={5 + i % 2}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for i in range(6)
    ]
    for process in processes:
        _, err = process.communicate(timeout=300)
        assert process.returncode == 0, err.decode()
    assert sorted(os.listdir(out)) == ["tiny"]
    expected = []
    for steps in (5, 6):
        expected.append(snapshot(compile_build(tmp_path / f"ref{steps}", [f"train.steps={steps}"]).dir))
    assert snapshot(out / "tiny") in expected
