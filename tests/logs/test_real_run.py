"""End to end: a real 2-rank CPU training run (`lmspec run`), then `lmspec logs` and `lmspec doctor`
on what it wrote. ~45-65 s on 2 cores (most of it torch/megatron start-up)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from helpers.cli import LMSPEC
from helpers.processes import run_in_group

from lmspec.compiler.build.reader import Build
from lmspec.compiler.models.flops import mfu
from lmspec.compiler.observe.logs.launcher import strip_prefix
from lmspec.compiler.observe.metrics_record import StepMetrics

RUN_TIMEOUT_S = 300


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return run_in_group(argv, cwd=cwd, timeout_s=RUN_TIMEOUT_S)


@pytest.mark.slow
def test_logs_and_doctor_on_a_real_cpu_run(tmp_path: Path) -> None:
    compiled = _run([LMSPEC, "compile", "-o", "build", "train.steps=10"], tmp_path)
    assert compiled.returncode == 0, compiled.stderr
    trained = _run([LMSPEC, "run", "build/tiny"], tmp_path)
    assert trained.returncode == 0, trained.stderr[-3000:]
    (tmp_path / "train.out").write_text(trained.stdout)
    # third-party warnings once per run (runtime/log.py): rank 0's first of each text, one line, no source echo
    shown = [line.partition("Warning: ")[2] for line in trained.stderr.splitlines() if "Warning: " in line]
    assert len(shown) == len(set(shown)) and "warnings.warn(" not in trained.stderr, trained.stderr
    lines = (tmp_path / "runs/tiny/metrics.jsonl").read_text().splitlines()
    jsonl = [line for line in lines if "val_loss" not in json.loads(line)]
    rows = [json.loads(line) for line in jsonl]
    assert [r["step"] for r in rows] == [5, 10]
    # validation after the last step (hardware=cpu: every 10 steps), a record of its own, and its line
    (validation,) = (json.loads(line) for line in lines if "val_loss" in json.loads(line))
    assert set(validation) == {"step", "val_loss"} and validation["step"] == 10
    assert f"lmspec: validation loss at step 10: {validation['val_loss']:.4f}" in trained.stdout
    # one record, two lines: what rank 0 printed is the text of what it wrote to metrics.jsonl
    printed = [line for line in map(strip_prefix, trained.stdout.splitlines()) if line.startswith("step ")]
    assert printed == [StepMetrics.from_json(line).to_text() for line in jsonl]  # type: ignore[union-attr]

    report = _run(
        [
            LMSPEC,
            "logs",
            "runs/tiny",
            "--build",
            "build/tiny",
            "--warmup-steps",
            "0",
            "--format",
            "json",
            "--plot",
            "runs/tiny/metrics.png",
        ],
        tmp_path,
    )
    assert report.returncode == 0, report.stderr
    data = json.loads(report.stdout)
    plan = Build.open(tmp_path / "build/tiny").plan
    tokens = [plan.trained().batch.tokens_per_step / r["step_time_s"] for r in rows]
    assert data["metrics"]["tokens_per_s"]["mean"] == pytest.approx(sum(tokens) / len(tokens))
    # the runtime's own MFU (the Plan's tokens per step and FLOPs per token, its own clock) is the one lmspec
    # logs computes from the same Plan
    flops = plan.trained().flops
    expected = [mfu(t, flops.per_token, flops.n_gpus, flops.peak_tflops_per_gpu) for t in tokens]
    assert data["metrics"]["mfu"]["mean"] == pytest.approx(sum(expected) / len(expected))
    assert [r["mfu"] for r in rows] == pytest.approx(expected, rel=1e-12)
    assert data["peak_memory_bytes"] == max(r["peak_memory_bytes"] for r in rows)
    assert (tmp_path / "runs/tiny/metrics.png").stat().st_size > 0

    stdout_report = json.loads(
        _run([LMSPEC, "logs", "train.out", "--warmup-steps", "0", "--format", "json"], tmp_path).stdout
    )
    assert stdout_report["formats"] == ["lmspec-stdout"] and stdout_report["steps_logged"] == len(rows)

    for log in ("runs/tiny", "train.out"):
        doctor = _run([LMSPEC, "doctor", log, "--build", "build/tiny"], tmp_path)
        assert doctor.returncode == 0 and "healthy" in doctor.stdout, doctor.stdout
