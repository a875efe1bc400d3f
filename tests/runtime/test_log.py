"""The runtime's logging (runtime/log.py): the rank prefix, the levels, third-party warnings once per run on
rank 0, and `lmspec run --quiet/--verbose` reaching the ranks through LMSPEC_LOG_LEVEL. The real 2-rank run's
console is checked in tests/logs/test_real_run.py."""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers.build import compile_build
from helpers.cli import CliResult

from lmspec.compiler.errors import UsageError
from lmspec.runtime.log import LEVEL_ENV, log_level, rank_prefix, setup_logging

APEX = "Apex is not installed. Falling back to Torch Norm"


@pytest.mark.parametrize(
    ("env", "prefix"),
    [
        pytest.param({}, "", id="one-process"),
        pytest.param({"RANK": "0", "WORLD_SIZE": "1"}, "", id="torchrun-of-one"),
        pytest.param({"RANK": "3", "WORLD_SIZE": "8"}, "[rank3]: ", id="rank-3-of-8"),
    ],
)
def test_rank_prefix(env: dict[str, str], prefix: str) -> None:
    assert rank_prefix(env) == prefix


def _warn_as_megatron_does() -> None:
    """Two modules warning the same text (megatron-core's backends.py and gpt_layer_specs.py), each
    twice, and a library logger's warning twice (megatron's BlendedDataset, built for train and valid)."""
    for _ in range(2):
        warnings.warn(APEX, UserWarning, stacklevel=1)
        warnings.warn(APEX, UserWarning, stacklevel=1)
        logging.getLogger("megatron.core.datasets").warning("Building a BlendedDataset")


def _ranked(monkeypatch: pytest.MonkeyPatch, rank: int, level: str | None = None) -> None:
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", "2")
    setup_logging(level)
    warnings.simplefilter("always")  # as a rank sees each location's first warning; pytest may have seen them


@pytest.mark.usefixtures("runtime_logging")
def test_third_party_warnings_once_on_rank_0(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _ranked(monkeypatch, 0)
    _warn_as_megatron_does()
    logging.getLogger("lmspec.runtime.train.loop").info("lmspec: saved runs/x/checkpoints/step_2")
    logging.getLogger("lmspec.runtime.train.checkpoint").warning("lmspec: warning: step_4 is not usable")
    logging.getLogger("lmspec.runtime.train.checkpoint").warning("lmspec: warning: step_4 is not usable")
    out, err = capsys.readouterr()
    assert out == "[rank0]: lmspec: saved runs/x/checkpoints/step_2\n"
    lines = err.splitlines()
    assert len(lines) == 4, err  # each third-party text once; lmspec's own warnings every time
    (apex,) = (line for line in lines if APEX in line)
    assert apex.startswith("[rank0]: ") and "test_log.py:" in apex and f"UserWarning: {APEX}" in apex
    assert "[rank0]: megatron.core.datasets: warning: Building a BlendedDataset" in lines
    assert lines.count("[rank0]: lmspec: warning: step_4 is not usable") == 2


@pytest.mark.usefixtures("runtime_logging")
def test_other_ranks_show_third_party_warnings_only_when_verbose(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _ranked(monkeypatch, 1)
    _warn_as_megatron_does()
    logging.getLogger("megatron.core").error("a library's error shows on every rank")
    assert capsys.readouterr().err == "[rank1]: megatron.core: error: a library's error shows on every rank\n"
    _ranked(monkeypatch, 1, "DEBUG")
    _warn_as_megatron_does()
    logging.getLogger("lmspec.runtime.train.loop").debug("lmspec: a debug line")
    out, err = capsys.readouterr()
    assert out == "[rank1]: lmspec: a debug line\n"
    assert err.count(APEX) == 4 and err.count("Building a BlendedDataset") == 2


@pytest.mark.usefixtures("runtime_logging")
def test_quiet_shows_warnings_and_errors_only(capsys: pytest.CaptureFixture[str]) -> None:
    setup_logging("WARNING")
    log = logging.getLogger("lmspec.runtime.train.loop")
    log.info("lmspec: saved runs/x/checkpoints/step_2")
    log.error("lmspec: error: the loss is NaN")
    assert capsys.readouterr() == ("", "lmspec: error: the loss is NaN\n")


def test_an_unknown_level_is_a_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(LEVEL_ENV, "loud")
    with pytest.raises(UsageError, match="LMSPEC_LOG_LEVEL='LOUD' is not a log level: use one of DEBUG, INFO, WARNING"):
        log_level()
    assert log_level("debug") == "DEBUG"


@pytest.mark.parametrize(("flag", "level"), [("--quiet", "WARNING"), ("--verbose", "DEBUG"), (None, "INFO")])
@pytest.mark.usefixtures("runtime_logging")
def test_run_flags_reach_the_ranks_environment(
    flag: str | None, level: str, lmspec: Callable[..., CliResult], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`lmspec run` exports the level; the launch scripts' torchrun passes its environment to every rank."""
    build = compile_build(tmp_path / "build").dir
    result = lmspec("run", str(build), "--dry-run", *([flag] if flag else []))
    assert result.code == 0, result.err
    assert os.environ[LEVEL_ENV] == level


def test_quiet_and_verbose_exclude_each_other(
    lmspec: Callable[..., CliResult], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit, match="2"):
        lmspec("run", str(tmp_path), "--quiet", "--verbose")
    assert "argument --verbose: not allowed with argument --quiet" in capsys.readouterr().err
