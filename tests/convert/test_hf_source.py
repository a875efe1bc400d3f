"""What the HF -> Megatron import refuses before any rank starts (lmspec.runtime.convert.hf_source); no torchrun."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from lmspec.compiler.errors import UsageError
from lmspec.runtime.convert.hf_source import BlockFp8, HfTensors, check_source, quantization

RELEASE = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]}
EMITTED = {"architectures": ["DeepseekV3ForCausalLM"], "hidden_size": 256, "torch_dtype": "float32"}


@pytest.mark.parametrize(
    "change,expected",
    [
        ({"quant_method": "awq"}, "quantization_config.quant_method is 'awq'"),
        ({"fmt": "e5m2"}, "quantization_config.fmt is 'e5m2'"),
        ({"weight_block_size": [64, 64]}, "quantization_config.weight_block_size is [64, 64]"),
        ({"modules_to_not_convert": ["lm_head"]}, "quantization_config.modules_to_not_convert is unknown"),
    ],
    ids=["method", "format", "block", "unknown-field"],
)
def test_unknown_quantisation_is_refused_naming_the_field(change: dict, expected: str) -> None:
    with pytest.raises(UsageError, match=expected.replace("[", r"\[").replace("]", r"\]")):
        quantization({"quantization_config": {**RELEASE, **change}})


def test_the_release_quantisation_reads_as_128_blocks() -> None:
    assert quantization({"quantization_config": RELEASE}) == BlockFp8((128, 128))
    assert quantization({}) is None


def test_a_scale_grid_that_does_not_cover_the_weight_is_refused() -> None:
    weight = torch.zeros(160, 256, dtype=torch.float8_e4m3fn)
    with pytest.raises(UsageError, match=r"needs a 2x2 scale_inv, the checkpoint has \(1, 2\)"):
        BlockFp8().dequantize(weight, torch.ones(1, 2))


def _hf_dir(root: Path, config: dict, tensors: dict[str, torch.Tensor]) -> Path:
    root.mkdir()
    (root / "config.json").write_text(json.dumps(config))
    save_file(tensors, str(root / "model.safetensors"))
    return root


@pytest.mark.parametrize(
    "config,expected",
    [
        ({**EMITTED, "architectures": ["LlamaForCausalLM"]}, "config.json field architectures"),
        ({**EMITTED, "hidden_size": 512}, "config.json field hidden_size: .* has 512, the build's model has 256"),
    ],
    ids=["architecture", "dims"],
)
def test_a_config_of_another_model_is_refused_naming_the_field(tmp_path: Path, config: dict, expected: str) -> None:
    hf = _hf_dir(tmp_path / "hf", config, {"w": torch.zeros(1)})
    with pytest.raises(UsageError, match=expected):
        check_source(hf, EMITTED)


def test_metadata_fields_may_differ_and_a_missing_directory_is_named(tmp_path: Path) -> None:
    hf = _hf_dir(tmp_path / "hf", {**EMITTED, "torch_dtype": "bfloat16"}, {"w": torch.zeros(1)})
    assert check_source(hf, EMITTED) is None
    with pytest.raises(UsageError, match="no such directory"):
        check_source(tmp_path / "nowhere", EMITTED)


def test_fp8_tensors_without_a_quantization_config_or_scale_are_refused(tmp_path: Path) -> None:
    fp8 = {"a.weight": torch.zeros(4, 4, dtype=torch.float8_e4m3fn)}
    plain = HfTensors(_hf_dir(tmp_path / "plain", EMITTED, fp8))
    with pytest.raises(UsageError, match="a.weight is torch.float8_e4m3fn but config.json's quantization_config"):
        plain.get("a.weight")
    unscaled = HfTensors(_hf_dir(tmp_path / "unscaled", {**EMITTED, "quantization_config": RELEASE}, fp8))
    with pytest.raises(UsageError, match="no a.weight_scale_inv"):
        unscaled.get("a.weight")
