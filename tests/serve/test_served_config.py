"""The served directory's config.json against the spec (compiler/serve_config.py), on published configs."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers.paths import ROOT

from lmspec.compiler.families import FAMILIES
from lmspec.compiler.pipeline import make_plan
from lmspec.compiler.serve_config import served_config_problems
from lmspec.compiler.spec.sections import ModelSpec, ServingSpec
from lmspec.compiler.spec.typed import from_dict

CONFIGS = ROOT / "tests" / "data" / "hf_configs"
MODEL_PRESETS = sorted(p.stem for p in (ROOT / "specs" / "model").glob("*.yaml"))


def _config(name: str) -> dict[str, Any]:
    return json.loads((CONFIGS / f"{name}.json").read_text(encoding="utf-8"))


def _spec(preset: str, *overrides: str) -> ServingSpec:
    return make_plan(list(overrides), Path(ROOT / "specs" / f"{preset}.yaml")).served().spec


def _serve(spec: ServingSpec, **changes: Any) -> ServingSpec:
    """`spec` with serve keys changed past the compiler's rules (the function is also the runtime's last word)."""
    return dataclasses.replace(spec, serve=dataclasses.replace(spec.serve, **changes))


@pytest.fixture(scope="module")
def deepseek() -> ServingSpec:
    return _spec("deepseek_v3_serve_8gpu_h200_fp8")


@pytest.fixture(scope="module")
def llama70b() -> ServingSpec:
    return _spec("llama3_70b_serve_8gpu_h100_bf16")


def test_deepseek_v3_fp8_release_is_the_preset_s_model(deepseek: ServingSpec) -> None:
    assert served_config_problems(deepseek, _config("DeepSeek-V3")) == []


def test_fp8_release_served_as_unquantized_is_refused_with_the_fix(deepseek: ServingSpec) -> None:
    (problem,) = served_config_problems(_serve(deepseek, quantization=None), _config("DeepSeek-V3"))
    assert "serve.quantization=null" in problem and "quant_method='fp8'" in problem
    assert problem.endswith("use serve.quantization=fp8")


def test_quantization_other_than_the_checkpoint_s_is_refused(deepseek: ServingSpec) -> None:
    (problem,) = served_config_problems(_serve(deepseek, quantization="awq"), _config("DeepSeek-V3"))
    assert problem.startswith("serve.quantization=awq but") and problem.endswith("use serve.quantization=fp8")


def test_calibrated_method_without_a_calibrated_checkpoint_is_refused(llama70b: ServingSpec) -> None:
    (problem,) = served_config_problems(_serve(llama70b, quantization="gptq"), _config("Meta-Llama-3-70B"))
    assert "needs a checkpoint calibrated for GPTQ" in problem and "no quantization_config" in problem
    # fp8 on an unquantized checkpoint is vLLM quantizing on load: consistent
    assert served_config_problems(_serve(llama70b, quantization="fp8"), _config("Meta-Llama-3-70B")) == []


def test_llama3_70b_release_is_the_preset_s_model(llama70b: ServingSpec) -> None:
    assert served_config_problems(llama70b, _config("Meta-Llama-3-70B")) == []


def test_another_model_is_refused_naming_each_key_both_values_and_the_fix(llama70b: ServingSpec) -> None:
    problems = served_config_problems(llama70b, _config("Llama-3.1-8B"))
    (problem,) = problems
    for key, ours, theirs in (
        ("num_layers", 80, 32),
        ("hidden_size", 8192, 4096),
        ("ffn_hidden_size", 28672, 14336),
        ("num_attention_heads", 64, 32),
        ("max_position_embeddings", 8192, 131072),
    ):
        assert f"model.{key} is {ours} in the spec but {theirs} in models/Meta-Llama-3-70B/config.json" in problem
    assert "model.num_kv_heads" not in problem and "model.vocab_size" not in problem  # equal keys are not named
    assert "lmspec import-model models/Meta-Llama-3-70B -o specs/model/NAME.yaml" in problem


def test_layout_checks_read_the_served_config(llama70b: ServingSpec, deepseek: ServingSpec) -> None:
    config = _config("Meta-Llama-3-70B")
    problems = served_config_problems(_serve(llama70b, tp=3, max_model_len=9000, expert_parallel=True), config)
    assert problems == [
        "serve.tp=3 does not divide the served model's 64 attention heads (models/Meta-Llama-3-70B/config.json); "
        "use a serve.tp that divides 64",
        "serve.max_model_len=9000 exceeds the 8192 tokens vLLM derives from models/Meta-Llama-3-70B/config.json "
        "(max_position_embeddings, rope_scaling); use serve.max_model_len<=8192",
        "serve.expert_parallel=true but models/Meta-Llama-3-70B/config.json is a dense model (no experts); "
        "use serve.expert_parallel=false",
    ]
    assert served_config_problems(_serve(deepseek, tp=8, expert_parallel=True), _config("DeepSeek-V3")) == []


def test_a_config_lmspec_cannot_import_is_named(llama70b: ServingSpec) -> None:
    config = {**_config("Meta-Llama-3-70B"), "hidden_act": "gelu"}
    (problem,) = served_config_problems(llama70b, config)
    assert problem.startswith("models/Meta-Llama-3-70B/config.json: config.json field hidden_act: is 'gelu'")


def test_max_model_len_is_the_length_vllm_derives(llama70b: ServingSpec) -> None:
    """A linear rope_scaling multiplies the positions (vLLM's _get_and_verify_max_len): 9000 then fits."""
    config = {**_config("Meta-Llama-3-70B"), "rope_scaling": {"type": "linear", "factor": 2.0}}
    (problem,) = served_config_problems(_serve(llama70b, max_model_len=9000), config)
    assert problem.startswith("models/Meta-Llama-3-70B/config.json is not the spec's model: model.rope_scaling")


@pytest.mark.parametrize("preset", MODEL_PRESETS)
def test_the_config_lmspec_converts_to_is_the_spec_s_model(preset: str, llama70b: ServingSpec) -> None:
    """What the converter writes (the family's hf_config) is served without a complaint, for every family."""
    model = from_dict(ModelSpec, yaml.safe_load((ROOT / "specs" / "model" / f"{preset}.yaml").read_text()))
    spec = dataclasses.replace(llama70b, model=model)
    spec = _serve(spec, tp=1, max_model_len=128, expert_parallel=False, quantization=None)
    assert served_config_problems(spec, FAMILIES[model.family].hf_config(model)) == []
