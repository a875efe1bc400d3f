"""Three kinds of job from one spec language: train and serve, train only (serve: null), serve only (train: null)."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.build import compile_build

from lmspec.compiler.build.files import DS_CONFIG, MAPPING, MEMORY_CHART, SERVE_SH, TORCHRUN_SH, VLLM_YAML
from lmspec.compiler.build.reader import Build
from lmspec.compiler.errors import SpecError, UsageError
from lmspec.compiler.pipeline import make_plan

SERVE_ONLY = ["train=null", "parallel=null", "convert=null", "serve.model_path=models/tiny", "serve.max_model_len=128"]


def _errors(overrides: list[str]) -> list[tuple[str, str]]:
    with pytest.raises(SpecError) as caught:
        make_plan(overrides)
    return [(p.key, p.message) for p in caught.value.problems if p.severity == "error"]


@pytest.mark.parametrize("nulled", ["serve=null", "~serve"])
def test_a_train_only_job_has_no_serving_part(nulled: str, tmp_path: Path) -> None:
    compiled = compile_build(tmp_path, [nulled, "hardware=cpu"])  # cpu.yaml also sizes serve: the section stays null
    assert compiled.plan.spec.serve is None and compiled.plan.serve is None
    assert compiled.plan.train is not None
    files = Build.open(compiled.dir).manifest.files
    assert TORCHRUN_SH in files and MAPPING in files and MEMORY_CHART in files
    assert not any(rel.startswith("serve/") for rel in files)
    report = (compiled.dir / "REPORT.md").read_text(encoding="utf-8")
    assert "not served (serve: null)" in report and "## Serving" not in report
    with pytest.raises(UsageError, match="train-only job"):
        Build.open(compiled.dir).serving()


def test_a_serve_only_job_has_no_training_part(tmp_path: Path) -> None:
    compiled = compile_build(tmp_path, SERVE_ONLY)
    plan = compiled.plan
    assert plan.train is None and plan.spec.train is None
    assert plan.served().model_dir == "models/tiny"
    files = Build.open(compiled.dir).manifest.files
    assert {SERVE_SH, VLLM_YAML} <= set(files)
    assert not {TORCHRUN_SH, MAPPING, MEMORY_CHART, DS_CONFIG} & set(files)
    report = (compiled.dir / "REPORT.md").read_text(encoding="utf-8")
    assert "Serve-only job" in report and "## Training memory" not in report and "## Serving" in report
    assert plan.to_document()["layout"] is None and plan.to_document()["serve"]["max_model_len_that_fits"] > 0
    with pytest.raises(UsageError, match="serve-only job"):
        Build.open(compiled.dir).training()


def test_a_serve_only_job_needs_a_model_directory() -> None:
    errors = _errors(["train=null", "parallel=null", "convert=null", "serve.max_model_len=128"])
    assert [key for key, _ in errors] == ["serve.model_path"]
    assert "nothing to serve" in errors[0][1]


def test_a_job_that_neither_trains_nor_serves_is_refused() -> None:
    errors = _errors(["train=null", "serve=null"])
    assert [key for key, _ in errors] == ["train"]
    assert "neither trains nor serves" in errors[0][1]


def test_training_needs_a_layout() -> None:
    errors = _errors(["parallel=null"])
    assert ("parallel" in [key for key, _ in errors]) and "needs a parallel layout" in dict(errors)["parallel"]


def test_sections_a_serve_only_job_does_not_read_are_named() -> None:
    plan = make_plan(["train=null", "serve.model_path=models/tiny", "serve.max_model_len=128"])
    (warning,) = plan.warnings
    assert warning.key == "parallel"
    assert "parallel and convert are not read in a serve-only job" in warning.message
    assert "parallel=null convert=null" in warning.message


def test_an_interpolation_into_a_null_section_names_the_key_to_set() -> None:
    errors = _errors(["train=null", "parallel=null", "convert=null", "serve.model_path=models/tiny"])
    assert errors == [
        (
            "serve.max_model_len",
            "serve.max_model_len (lmspec:specs/serve/default.yaml:10) reads train.seq_length through "
            "${train.seq_length}, but train (command-line override) is null: set serve.max_model_len to a value of "
            "its own",
        )
    ]
