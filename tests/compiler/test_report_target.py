"""REPORT.md names the target that trains the build and the kernels it picks (compiler/capabilities.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.build import compile_build

CASES = [
    pytest.param(
        ["model=tiny_moe"],
        None,
        "Target: megatron, train.transformer_impl=local, cpu; unfused attention (stores the s x s scores), "
        "experts one after another.",
        id="tiny-moe-cpu",
    ),
    pytest.param(
        [],
        "deepseek_v3_pretrain_2048gpu_h800_bf16",
        "Target: megatron, train.transformer_impl=transformer_engine, gpu; fused attention, grouped-GEMM experts.",
        id="deepseek-v3-te",
    ),
    pytest.param(
        [],
        "tiny_deepspeed_zero3_2rank_cpu_fp32",
        "Target: deepspeed, train.transformer_impl=local, cpu; unfused attention (stores the s x s scores).",
        id="deepspeed-cpu",
    ),
]


@pytest.mark.parametrize(("overrides", "spec", "line"), CASES)
def test_report_names_the_target(tmp_path: Path, overrides: list[str], spec: str | None, line: str) -> None:
    built = compile_build(tmp_path, overrides, spec)
    report = (built.dir / "REPORT.md").read_text().splitlines()
    assert report[3] == line
