"""What a quantize stage's checkpoint weighs and how fast vLLM runs it (compiler/quantize_modules.py, read by
serve_memory.weight_split and serve_step.linear_rates), and the served config.json checked against the spec
(compiler/serve_config.py) with the quantization_config llm-compressor 0.14 writes."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest
from helpers.specs import spec_of

from lmspec.compiler.families import FAMILIES
from lmspec.compiler.models.params import count_params
from lmspec.compiler.models.serve_memory import estimate_serve_memory, weight_split
from lmspec.compiler.models.serve_step import Batch, engine_shape, gpu_constants, linear_rates, step_time
from lmspec.compiler.quantize_modules import bytes_per_weight, checkpoint_scheme, quantized_model
from lmspec.compiler.serve_config import served_config_problems
from lmspec.compiler.spec.sections import ServingSpec, serving

SERVED = "serve.quantization=compressed-tensors"
LLAMA_8B_H100 = ("model=llama3_8b", "hardware=h100_80g", "serve.tp=1", "convert.dtype=bfloat16")
MIXTRAL_H100 = ("model=mixtral_8x7b", "hardware=h100_80g", "serve.tp=8", "convert.dtype=bfloat16")
KEEP_EXPERTS = 'quantize.keep=["lm_head","re:.*block_sparse_moe[.]gate$","re:.*block_sparse_moe[.]experts[.].*"]'
# config.json's quantization_config of a W4A16 GPTQ checkpoint llm-compressor 0.14 wrote (group 32, a MoE model
# whose first layer is dense): its routers and output head ignored.
W4A16_G32 = {
    "config_groups": {
        "group_0": {
            "format": "pack-quantized",
            "input_activations": None,
            "output_activations": None,
            "targets": ["Linear"],
            "weights": {
                "actorder": "static",
                "block_structure": None,
                "dynamic": False,
                "group_size": 32,
                "num_bits": 4,
                "observer": "memoryless_minmax",
                "strategy": "group",
                "symmetric": True,
                "type": "int",
            },
        }
    },
    "format": "pack-quantized",
    "ignore": ["model.layers.1.mlp.gate", "model.layers.2.mlp.gate", "lm_head"],
    "quant_method": "compressed-tensors",
    "quantization_status": "compressed",
    "version": "0.19.0",
}


def _serving(*overrides: str) -> ServingSpec:
    served = serving(spec_of(*overrides))
    assert served is not None
    return served


def test_dense_weights_shrink_w4a16_below_fp8_below_bf16() -> None:
    bf16 = weight_split(_serving(*LLAMA_8B_H100)).dense
    fp8 = weight_split(_serving(*LLAMA_8B_H100, "quantize=fp8_dynamic", SERVED)).dense
    w4a16 = weight_split(_serving(*LLAMA_8B_H100, "quantize=w4a16_gptq", SERVED)).dense
    assert w4a16 < fp8 < bf16
    # exactly the linear layers change: 2 bytes -> half a byte and a bf16 scale per 128 weights
    spec = _serving(*LLAMA_8B_H100, "quantize=w4a16_gptq", SERVED)
    linear = quantized_model(spec, 2)
    params = linear.attention.params + linear.dense_mlp.params
    assert linear.attention.quantized_share == linear.dense_mlp.quantized_share == 1.0
    assert bf16 - w4a16 == pytest.approx(params * (2 - (0.5 + 2 / 128)), rel=1e-12)
    assert (
        estimate_serve_memory(spec).max_tokens_in_cache
        > estimate_serve_memory(_serving(*LLAMA_8B_H100)).max_tokens_in_cache
    )


def test_scales_and_zero_points_are_counted() -> None:
    gptq = _serving(*LLAMA_8B_H100, "quantize=w4a16_gptq", SERVED)
    awq = _serving(*LLAMA_8B_H100, "quantize=w4a16_awq", SERVED)
    assert gptq.quantize is not None and awq.quantize is not None
    assert bytes_per_weight(gptq.quantize, 4096, 2) == 0.5 + 2 / 128
    assert bytes_per_weight(awq.quantize, 4096, 2) == 0.5 + 2.5 / 128  # a 4-bit zero point beside each scale
    per_channel = dataclasses.replace(gptq.quantize, group_size=None)
    assert bytes_per_weight(per_channel, 4096, 2) == 0.5 + 2 / 4096
    fp8_dynamic = _serving(*LLAMA_8B_H100, "quantize=fp8_dynamic", SERVED).quantize
    static = _serving(*LLAMA_8B_H100, "quantize=fp8", SERVED).quantize
    assert fp8_dynamic is not None and static is not None
    assert bytes_per_weight(fp8_dynamic, 4096, 2) == 1 + 4 / 4096  # an fp32 scale per output channel
    assert bytes_per_weight(static, 4096, 2) == 1  # one scale per weight matrix


def test_kept_experts_stay_at_the_dtype_and_quantized_ones_shrink() -> None:
    counts = count_params(_serving(*MIXTRAL_H100).model)
    kept = _serving(*MIXTRAL_H100, "quantize=w4a16_gptq", SERVED, KEEP_EXPERTS)
    quantized = _serving(*MIXTRAL_H100, "quantize=w4a16_gptq", SERVED)
    assert weight_split(kept).experts == pytest.approx(counts.expert * 2 / 8, rel=1e-12)
    assert weight_split(quantized).experts == pytest.approx(counts.expert * (0.5 + 2 / 128) / 8, rel=1e-12)
    assert weight_split(kept).dense == pytest.approx(weight_split(quantized).dense, rel=1e-12)  # attention alike
    assert quantized_model(kept, 2).experts.quantized_share == 0.0


def test_linear_rates_follow_the_scheme_and_the_kept_layers() -> None:
    bf16, fp8 = 989, 1979  # specs/hardware/h100_80g.yaml
    assert linear_rates(_serving(*LLAMA_8B_H100)) == (bf16, bf16)
    assert linear_rates(_serving(*LLAMA_8B_H100, "quantize=w4a16_gptq", SERVED)) == (bf16, bf16)
    dense, experts = linear_rates(_serving(*MIXTRAL_H100, "quantize=fp8_dynamic", SERVED, KEEP_EXPERTS))
    assert experts == bf16 and fp8 * 0.9 < dense < fp8  # the kept output head runs at bf16
    a100 = _serving("hardware=a100_80g", "serve.tp=1", "quantize=int8_smoothquant", SERVED)
    dense, _ = linear_rates(a100)
    assert 312 < dense <= 2 * 312  # INT8 tensor cores: twice bf16's 312 on the quantized share
    ampere_fp8 = _serving("hardware=a100_80g", "serve.tp=1", "quantize=fp8_dynamic", SERVED)
    assert linear_rates(ampere_fp8) == (312, 312)  # weight-only FP8 (Marlin) multiplies in bf16


def test_a_decode_step_reads_fewer_bytes_when_quantized() -> None:
    batch = Batch(decode_seqs=1, decode_context=1024, prefill_tokens=0, prefill_context=0)

    def linear_s(*overrides: str) -> float:
        spec = _serving(*LLAMA_8B_H100, *overrides)
        return step_time(engine_shape(spec, estimate_serve_memory(spec)), batch, gpu_constants()).linear_s

    assert linear_s("quantize=w4a16_gptq", SERVED) < linear_s("quantize=fp8_dynamic", SERVED) < linear_s()


def _tiny_moe_w4a16_g32() -> tuple[ServingSpec, dict[str, Any]]:
    spec = _serving("model=tiny_moe", "model.num_layers=3", "quantize=w4a16_gptq", "quantize.group_size=32", SERVED)
    config = {**FAMILIES[spec.model.family].hf_config(spec.model), "quantization_config": copy.deepcopy(W4A16_G32)}
    return spec, config


def test_the_checkpoint_llm_compressor_wrote_is_the_spec_s() -> None:
    spec, config = _tiny_moe_w4a16_g32()
    assert spec.quantize is not None
    assert checkpoint_scheme(spec.quantize)["input_activations"] is None
    assert served_config_problems(spec, config) == []


def test_another_group_size_is_refused_with_both_values() -> None:
    spec, config = _tiny_moe_w4a16_g32()
    assert spec.quantize is not None
    other = dataclasses.replace(spec, quantize=dataclasses.replace(spec.quantize, group_size=64))
    (problem,) = served_config_problems(other, config)
    assert "config_groups.group_0.weights has group_size=32 (the spec's 64)" in problem
    assert "run `lmspec run BUILD --stage quantize`" in problem


def test_another_scheme_is_refused_weights_and_activations() -> None:
    spec, config = _tiny_moe_w4a16_g32()
    assert spec.quantize is not None
    fp8 = dataclasses.replace(spec, quantize=dataclasses.replace(spec.quantize, scheme="fp8_dynamic", group_size=None))
    weights, activations = served_config_problems(fp8, config)
    assert "num_bits=4 (the spec's 8), type='int' (the spec's 'float')" in weights
    assert "group_0.input_activations is null, but quantize.scheme=fp8_dynamic" in activations
    assert "strategy='token'" in activations and "dynamic=True" in activations


def test_a_router_the_checkpoint_quantized_is_refused() -> None:
    spec, config = _tiny_moe_w4a16_g32()
    config["quantization_config"]["ignore"] = ["lm_head"]
    (problem,) = served_config_problems(spec, config)
    assert "the spec keeps model.layers.1.mlp.gate" in problem and "the checkpoint quantized it" in problem


def test_compressed_tensors_without_a_quantization_config_is_refused() -> None:
    spec, config = _tiny_moe_w4a16_g32()
    del config["quantization_config"]
    (problem,) = served_config_problems(spec, config)
    assert problem.startswith("serve.quantization=compressed-tensors needs a checkpoint llm-compressor wrote")
    assert "runs/tiny_moe/hf-w4a16_gptq/config.json has no quantization_config" in problem
