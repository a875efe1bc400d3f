"""The quantize stage's one-line refusals that need no trained model: nothing converted yet, no llm-compressor.
Each names the key or variable and the fix, exits 2, and starts nothing."""

from __future__ import annotations

import os
from pathlib import Path

from helpers.build import compile_build
from helpers.cli import LMSPEC
from helpers.processes import run_in_group

from lmspec.runtime.quantize.stage import QUANTIZE_PYTHON_ENV

QUANTIZING = ["quantize=w4a16_gptq", "serve.quantization=compressed-tensors", "serve.dtype=bfloat16"]


def _quantize(tmp_path: Path, env: dict[str, str]) -> tuple[int, str]:
    build = compile_build(tmp_path / "build", QUANTIZING).dir
    done = run_in_group([LMSPEC, "run", str(build), "--stage", "quantize"], cwd=tmp_path, timeout_s=120, env=env)
    return done.returncode, done.stdout + done.stderr


def test_quantize_before_convert_names_the_stage_to_run(tmp_path: Path) -> None:
    code, out = _quantize(tmp_path, dict(os.environ))
    assert code == 2, out
    assert "convert.output=runs/tiny/hf" in out and "--stage convert` first" in out
    assert not (tmp_path / "runs/tiny/hf-w4a16_gptq").exists()


def test_quantize_without_llm_compressor_names_the_variable(tmp_path: Path) -> None:
    (tmp_path / "runs/tiny/hf").mkdir(parents=True)
    (tmp_path / "runs/tiny/hf/config.json").write_text("{}")
    env = {k: v for k, v in os.environ.items() if k != QUANTIZE_PYTHON_ENV}
    code, out = _quantize(tmp_path, env)
    assert code == 2, out
    assert f"set {QUANTIZE_PYTHON_ENV}" in out and ".venv-quantize/bin/python" in out


def test_quantize_with_a_missing_interpreter_names_it(tmp_path: Path) -> None:
    (tmp_path / "runs/tiny/hf").mkdir(parents=True)
    (tmp_path / "runs/tiny/hf/config.json").write_text("{}")
    code, out = _quantize(tmp_path, {**os.environ, QUANTIZE_PYTHON_ENV: str(tmp_path / "no-python")})
    assert code == 2, out
    assert f"{QUANTIZE_PYTHON_ENV}={tmp_path / 'no-python'} is not an executable file" in out
