"""vLLM judges a quantizing build's serving options: `--quantization compressed-tensors` on the model directory
the serve stage serves (quantize.output), holding the converted model's config.json with the quantization_config
the spec's scheme writes (compiler/quantize_modules.py checkpoint_scheme); vLLM parses the options and builds its
engine config, which reads that quantization_config as its own CompressedTensorsConfig."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.marks import needs_vllm
from helpers.vllm_check import check_batch

from lmspec.compiler.conversion.mapping import hf_config
from lmspec.compiler.emit.serve import vllm_serve_args
from lmspec.compiler.pipeline import make_plan
from lmspec.compiler.quantize_modules import checkpoint_scheme, kept_modules

pytestmark = [needs_vllm, pytest.mark.slow]  # one vLLM process judges the three: ~20 s

FORMATS = {"w4a16_gptq": "pack-quantized", "int8_smoothquant": "int-quantized", "fp8_dynamic": "float-quantized"}


def test_vllm_builds_its_engine_config_for_the_quantized_checkpoint(tmp_path: Path) -> None:
    argvs, plans = [], []
    for preset, fmt in FORMATS.items():
        model = tmp_path / preset
        model.mkdir()
        overrides = [f"quantize={preset}", "serve.quantization=compressed-tensors", f"quantize.output={model}"]
        plan = make_plan([*overrides, "serve.dtype=bfloat16"])  # cpu_gemm_wna16 has no float32 path (a rule)
        assert plan.spec.quantize is not None and plan.served().model_dir == str(model)
        scheme = checkpoint_scheme(plan.spec.quantize)
        group = {"format": fmt, "targets": ["Linear"], "output_activations": None, **scheme}
        config = {
            "config_groups": {"group_0": group},
            "format": fmt,
            "ignore": list(kept_modules(plan.spec)),
            "quant_method": "compressed-tensors",
            "quantization_status": "compressed",
        }
        (model / "config.json").write_text(json.dumps({**hf_config(plan), "quantization_config": config}))
        argvs.append(["serve", *vllm_serve_args(plan)])
        plans.append(plan)
    for plan, result in zip(plans, check_batch(argvs, tmp_path), strict=True):
        assert result["exit"] == 0, result["error"]
        assert result["args"]["quantization"] == "compressed-tensors"
        assert result["args"]["_engine_config_built"] is True, plan.spec.quantize
