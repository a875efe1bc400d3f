"""The MTP module megatron-core builds on lmspec's local path: counted as lmspec counts it, trained with
train.mtp_loss_weight, and the reported loss is the language-model loss alone (tests/helpers/mtp_worker.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from helpers.paths import ROOT
from helpers.ports import free_port

pytestmark = pytest.mark.slow  # a fresh interpreter importing megatron-core, ~15 s


@pytest.fixture(scope="module")
def report() -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.environ.get("PYTHONPATH", ""), str(ROOT / "tests")])}
    cmd = [sys.executable, str(ROOT / "tests" / "helpers" / "mtp_worker.py"), str(free_port())]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_params_equal_megatrons_built_mtp_module(report: dict) -> None:
    assert report["tiny_moe_built"] == report["tiny_moe_counted"]
    assert report["deepseek_v3_built"] == report["deepseek_v3_counted"]  # 11.6B: 14B with embedding and head


def test_the_memory_model_holds_the_mtp_module_on_the_last_stage(report: dict) -> None:
    from lmspec.compiler.pipeline import make_plan

    plan = make_plan(["model=tiny_moe", "hardware=cpu", "model.mtp_layers=1"])
    (stage,) = (
        plan.trained().memory.stages
    )  # tp = ep = pp = 1: the one stage holds the whole model, as megatron builds it
    assert stage.dense_params + stage.expert_params == report["tiny_moe_model_built"]


def test_the_local_swaps_apply_inside_the_mtp_layer(report: dict) -> None:
    assert report["modules"] == ["LatentCoreAttention", "SequenceParallelRMSNorm"]


def test_mtp_loss_weight_scales_its_gradient_and_the_reported_loss_is_the_lm_loss(report: dict) -> None:
    assert report["eh_proj_grad_at_weight_0"] == 0.0
    assert report["eh_proj_grad_linear_in_weight"] and report["decoder_grad_linear_in_weight"]
    assert report["decoder_grad_moves_with_weight"] > 0  # the MTP loss reaches the shared decoder
    losses = report["lm_losses"]
    assert losses[0] == losses[1] == losses[2] == report["lm_loss_without_mtp"]
