"""train.transformer_impl=transformer_engine where there is no GPU and no Transformer Engine (this
machine): `lmspec run` and the training entry point stop before building anything, naming the key and
both ways out."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

import pytest
import torch
from helpers.build import compile_build
from helpers.cli import LMSPEC

from lmspec.compiler.errors import EXIT_FAILED
from lmspec.compiler.pipeline import make_plan
from lmspec.runtime.train.loop import main
from lmspec.runtime.train.te_preflight import check_transformer_engine

ONE_GPU = ["hardware=h200_141g", "hardware.gpus_per_node=1", "train.seq_length=1024", "serve.max_model_len=1024"]
ONE_GPU += ["train.global_batch_size=8"]
pytestmark = pytest.mark.skipif(
    torch.cuda.is_available() or importlib.util.find_spec("transformer_engine") is not None,
    reason="needs a machine without a GPU and without Transformer Engine",
)


def test_no_gpu_and_no_transformer_engine_are_both_named_with_the_fixes() -> None:
    problems = check_transformer_engine(make_plan(ONE_GPU, None).spec)
    assert [p.key for p in problems] == ["train.transformer_impl", "train.transformer_impl"]
    gpu, te = (p.message for p in problems)
    assert "needs an NVIDIA GPU" in gpu and "torch.cuda.is_available() is False" in gpu
    assert "set train.transformer_impl=local" in gpu
    assert "import transformer_engine.pytorch` fails (ModuleNotFoundError" in te
    assert "pip install transformer_engine[pytorch]" in te and "set train.transformer_impl=local" in te


def test_the_local_path_needs_neither() -> None:
    local = ["train.transformer_impl=local", "train.flash_attention=false", *ONE_GPU]  # local attention is unfused
    assert check_transformer_engine(make_plan(local, None).spec) == []


@pytest.mark.usefixtures("runtime_logging")
def test_the_entry_point_exits_1_before_any_rank_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    build = compile_build(tmp_path, ONE_GPU).dir
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert main([str(build)]) == EXIT_FAILED
    err = capsys.readouterr().err
    assert "error: train.transformer_impl=transformer_engine needs an NVIDIA GPU" in err
    assert "Transformer Engine layers cannot run here (2 error(s)); nothing was started" in err
    assert "Traceback" not in err and not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_lmspec_run_stops_before_torchrun_with_one_report(tmp_path: Path) -> None:
    build = compile_build(tmp_path, ONE_GPU).dir
    done = subprocess.run([LMSPEC, "run", str(build)], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == EXIT_FAILED, done.stderr
    assert done.stderr.count("error: train.transformer_impl=transformer_engine needs an NVIDIA GPU") == 1
    assert "pip install transformer_engine[pytorch]" in done.stderr
    assert "Traceback" not in done.stderr and "torchrun" not in done.stderr and not (tmp_path / "runs").exists()
