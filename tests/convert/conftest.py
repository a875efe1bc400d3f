"""Real trained checkpoints for the conversion tests, once per session (see helpers.convert)."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.convert import MOE_TP2_EP2, V2_TP2_EP2, Trained, train


@pytest.fixture(scope="session")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("convert")


@pytest.fixture(scope="session")
def tiny_tp2(workdir: Path) -> Trained:
    """tiny (GQA 8 heads / 2 kv groups, square o_proj) trained at TP=2."""
    return train(workdir, "tiny_tp2", ["hardware=cpu", "parallel.tp=2"])


@pytest.fixture(scope="session")
def tiny_pp2(workdir: Path) -> Trained:
    return train(workdir, "tiny_pp2", ["hardware=cpu", "parallel.pp=2"])


@pytest.fixture(scope="session")
def tiny_moe_tp2_ep2(workdir: Path) -> Trained:
    """tiny_moe (DeepSeek-V3-shaped: MLA, 8 experts top-4 of 2 of 4 groups, sigmoid + correction bias, scaled
    by 2.5, 1 shared, first layer dense, YaRN, one MTP module) at TP=2 with EP=2."""
    return train(workdir, "tiny_moe_tp2_ep2", MOE_TP2_EP2, spec="tiny_moe_pretrain_2rank_cpu_fp32")


@pytest.fixture(scope="session")
def tiny_v2_tp2_ep2(workdir: Path) -> Trained:
    """tiny_moe as DeepSeek-V2 (helpers.convert.V2_TP2_EP2) at TP=2 with EP=2."""
    return train(workdir, "tiny_v2_tp2_ep2", V2_TP2_EP2, spec="tiny_moe_pretrain_2rank_cpu_fp32")


@pytest.fixture(scope="session")
def tiny_deepspeed_zero3(workdir: Path) -> Trained:
    """tiny trained by the DeepSpeed backend, ZeRO-3 over 2 ranks (the conversion consolidates)."""
    return train(workdir, "tiny_deepspeed_zero3", [], spec="tiny_deepspeed_zero3_2rank_cpu_fp32")


@pytest.fixture(scope="session")
def tiny_moe_deepspeed_zero2(workdir: Path) -> Trained:
    """tiny_moe trained by the DeepSpeed backend, ZeRO-2 over 2 ranks: transformers' module holds each MoE
    layer's experts fused, the release names them per expert."""
    overrides = ["model=tiny_moe", "parallel.zero_stage=2"]
    return train(workdir, "tiny_moe_deepspeed_zero2", overrides, spec="tiny_deepspeed_zero3_2rank_cpu_fp32")
