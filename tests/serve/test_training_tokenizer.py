"""The training tokenizer travels with the model: the converter refuses to start without it, and
serving a model directory that has none passes the training tokenizer to vLLM. No vLLM, no training."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers.build import Compiled, compile_build
from helpers.cli import CliResult
from helpers.hf import save_random_hf_llama
from helpers.tokenizers import train_bpe_tokenizer

from lmspec.runtime.serve.stage import _tokenizer_flags


@pytest.fixture
def bpe(tmp_path: Path) -> Path:
    return train_bpe_tokenizer(tmp_path / "bpe")


def _hf_tokenizer_build(tmp_path: Path, tok: Path, *extra: str) -> Compiled:
    return compile_build(
        tmp_path / "build", ["hardware=cpu", "train.data.tokenizer=hf", f"train.data.tokenizer_path={tok}", *extra]
    )


def test_convert_without_its_tokenizer_is_refused_before_the_checkpoint_is_read(
    lmspec: Callable[..., CliResult], bpe: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    _, build = _hf_tokenizer_build(tmp_path, bpe)
    shutil.rmtree(bpe)
    result = lmspec("run", str(build), "--stage", "convert")
    result.assert_reports(2, [f"train.data.tokenizer_path='{bpe}': no tokenizer.json there", "restore the tokenizer"])
    assert not (tmp_path / "runs").exists()


def test_serving_a_model_without_tokenizer_passes_the_training_one(
    bpe: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformers import AutoTokenizer

    monkeypatch.chdir(tmp_path)
    plan, _ = _hf_tokenizer_build(tmp_path, bpe, f"serve.model_path={tmp_path / 'bare'}")
    save_random_hf_llama(plan, tmp_path / "bare")  # weights and config only
    flags = _tokenizer_flags(plan)
    directory = tmp_path / "runs" / plan.name / "tokenizer"
    assert flags == ["--tokenizer", str(Path(plan.paths.run_dir) / "tokenizer")]
    assert (directory / "tokenizer.json").read_bytes() == (bpe / "tokenizer.json").read_bytes()
    text = "the model reads each token"
    served, trained = (AutoTokenizer.from_pretrained(str(d)) for d in (directory, bpe))
    assert served(text).input_ids == trained(text).input_ids

    shutil.copyfile(bpe / "tokenizer.json", tmp_path / "bare" / "tokenizer.json")
    assert _tokenizer_flags(plan) == []  # a model with its own tokenizer is served with it
