"""DeepSeek-V2-Lite and V3 as released: their published config.json reads into the presets exactly, the
config.json lmspec emits carries the router and YaRN as transformers and vLLM read them, and
quantisation other than the release's FP8 blocks is refused."""

from __future__ import annotations

import json
import re

import pytest
import yaml
from helpers.paths import ROOT

from lmspec.compiler.families import FAMILIES
from lmspec.compiler.families.hf_import import HfConfig, ImportRefused
from lmspec.compiler.spec.sections import ModelSpec
from lmspec.compiler.spec.typed import from_dict

RELEASES = {"DeepSeek-V2-Lite": "deepseek_v2_lite", "DeepSeek-V3": "deepseek_v3"}
ROUTER_AND_ROPE = ("n_group", "topk_group", "routed_scaling_factor", "norm_topk_prob", "scoring_func", "topk_method")


def published(name: str) -> dict:
    return json.loads((ROOT / "tests" / "data" / "hf_configs" / f"{name}.json").read_text())


def preset(name: str) -> dict:
    group = yaml.safe_load((ROOT / "specs" / "model" / f"{name}.yaml").read_text())
    return {k: v for k, v in group.items() if k not in ("name", "family")} | {"family": group["family"]}


@pytest.mark.parametrize("release", sorted(RELEASES))
def test_published_config_reads_into_the_preset_with_nothing_left(release: str) -> None:
    want = preset(RELEASES[release])
    config = HfConfig(published(release))
    assert FAMILIES[want.pop("family")].from_hf_config(config) == want
    assert config.unread() == []


@pytest.mark.parametrize("release", sorted(RELEASES))
def test_emitted_config_routes_and_scales_rope_as_the_release(release: str) -> None:
    """What transformers' DeepseekV2/V3 and vLLM's deepseek_v2.py read, with the release's values."""
    from transformers import AutoConfig

    group = preset(RELEASES[release])
    ours = FAMILIES[group["family"]].hf_config(from_dict(ModelSpec, {**group, "name": RELEASES[release]}))
    theirs = published(release)
    assert {k: ours[k] for k in ROUTER_AND_ROPE} == {k: theirs[k] for k in ROUTER_AND_ROPE}
    assert ours["rope_scaling"] == theirs["rope_scaling"]  # 40 == 40.0: JSON numbers
    read = AutoConfig.for_model(**{k: v for k, v in ours.items() if k != "architectures"})
    assert read.rope_parameters["rope_type"] == "yarn" and read.rope_parameters["factor"] == 40.0
    assert (read.n_group, read.topk_group, read.routed_scaling_factor) == (
        theirs["n_group"],
        theirs["topk_group"],
        theirs["routed_scaling_factor"],
    )


@pytest.mark.parametrize(
    "field,value",
    [("quant_method", "gptq"), ("fmt", "e5m2"), ("activation_scheme", "static"), ("weight_block_size", [64, 64])],
)
def test_other_quantisation_than_the_released_fp8_blocks_is_refused(field: str, value: object) -> None:
    config = published("DeepSeek-V3")
    config["quantization_config"] = {**config["quantization_config"], field: value}
    with pytest.raises(ImportRefused, match=re.escape(f"quantization_config.{field}: is {value!r}")):
        FAMILIES["deepseek_v3"].from_hf_config(HfConfig(config))
