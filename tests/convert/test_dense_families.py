"""The dense families' own parts, round-tripped on small models: trained by Megatron at TP=2, converted
to HF and compared by logits with transformers; then the HF weights imported back into a Megatron
checkpoint (runtime/convert/from_hf.py) and compared again. fp32 on CPU: within 1e-4 both ways.

llama: Llama-3.1's llama3 rope scaling (megatron-core's rope_scaling against transformers' rope_parameters);
mistral: Llama's tensors under MistralForCausalLM (sliding_window null);
qwen2: the q/k/v biases (1-D, interleaved by query group like the weight) and tied embeddings;
qwen3: the per-head q/k RMSNorms and a head_dim that is not hidden / heads.
"""

from __future__ import annotations

import pytest
from helpers.convert import Trained, compile_run_build, lmspec, train, verify_report

from lmspec.compiler.families import FAMILIES

pytestmark = pytest.mark.slow

MAX_ABS_DIFF = 1e-4
LLAMA3_ROPE = (
    "model.rope_scaling={type:llama3,factor:8.0,original_max_position_embeddings:8192,low_freq_factor:1.0,"
    "high_freq_factor:4.0,beta_fast:null,beta_slow:null,mscale:null,mscale_all_dim:null}"
)
FAMILY_OVERRIDES = {
    "llama": [LLAMA3_ROPE, "model.rope_theta=500000.0"],
    "mistral": ["model.family=mistral"],
    "qwen2": ["model.family=qwen2", "model.qkv_bias=true", "model.tie_embeddings=true"],
    "qwen3": ["model.family=qwen3", "model.qk_norm=true", "model.head_dim=64"],
}
TP2 = ["hardware=cpu", "parallel.tp=2"]


@pytest.fixture(scope="module", params=sorted(FAMILY_OVERRIDES))
def converted(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Trained]:
    """A tiny model of the family trained 3 steps at TP=2 and converted to HF."""
    family = request.param
    trained = train(tmp_path_factory.mktemp(family), f"tiny_{family}", [*TP2, *FAMILY_OVERRIDES[family]])
    result = lmspec("run", str(trained.build), "--stage", "convert", cwd=trained.workdir)
    assert result.returncode == 0, result.stderr[-3000:]
    return family, trained


def test_megatron_to_hf_logits_match_transformers(converted: tuple[str, Trained], record_property) -> None:  # noqa: ANN001
    family, trained = converted
    code, report, err = verify_report(trained)
    assert code == 0, err[-3000:]
    record_property("max_abs_diff", report["max_abs_diff"])  # the figure of the table (--junitxml)
    assert report["max_abs_diff"] <= MAX_ABS_DIFF, report
    config = (trained.hf_dir / "config.json").read_text(encoding="utf-8")
    assert f'"{FAMILIES[family].hf_class}"' in config


def test_hf_to_megatron_logits_match_transformers(converted: tuple[str, Trained], record_property) -> None:  # noqa: ANN001
    family, source = converted
    name = f"tiny_{family}_from_hf"
    build = compile_run_build(source.workdir, name, [*TP2, *FAMILY_OVERRIDES[family]])
    imported = lmspec("run", str(build), "--stage", "import", "--from", str(source.hf_dir), cwd=source.workdir)
    assert imported.returncode == 0, imported.stderr[-3000:]
    code, report, err = verify_report(Trained(source.workdir, build, name), source.hf_dir)
    assert code == 0, err[-3000:]
    record_property("max_abs_diff", report["max_abs_diff"])
    assert report["max_abs_diff"] <= MAX_ABS_DIFF, report
