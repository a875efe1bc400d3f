"""The TransformerConfig and layer specs the megatron trainer builds from megatron/config.json, per
train.transformer_impl, on CPU.

Transformer Engine is not installed here, so the TE path is checked as far as megatron-core 0.16.1 lets
it be without TE: the config's arguments (a pure function of the spec), the config megatron-core
builds from them, and the layer-spec builder it is handed to. megatron-core cannot build the TE layer
spec itself without TE (gpt_layer_specs imports TENorm/TESpecProvider only when `transformer_engine`
imports, TESpecProvider compares TE's version, and TE's layer classes are mocks), which the last test pins.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest
import torch

from lmspec.compiler.backends.megatron_config import megatron_config
from lmspec.compiler.pipeline import make_plan
from lmspec.compiler.plan import Plan
from lmspec.runtime.train.megatron.config import transformer_config, transformer_config_kwargs, wgrad_fusion_kernel
from lmspec.runtime.train.megatron.layer_specs import decoder_block_spec

# one H200 training the tiny model: a GPU target, so train/default.yaml's transformer_engine stands
ONE_GPU = ["hardware=h200_141g", "hardware.gpus_per_node=1", "train.seq_length=1024", "serve.max_model_len=1024"]
ONE_GPU += ["train.global_batch_size=8"]
HAVE_TE = importlib.util.find_spec("transformer_engine") is not None


def _plan(*overrides: str) -> Plan:
    return make_plan([*ONE_GPU, *overrides], None)


def _kwargs(plan: Plan) -> dict[str, Any]:
    """The arguments the runtime builds the TransformerConfig with, from the plan's megatron/config.json."""
    return transformer_config_kwargs(megatron_config(plan))


def _built(kwargs: dict[str, Any]) -> Any:
    """megatron-core's own config from these arguments, its validation included; RoPE fusion off
    because megatron-core checks at construction that TE's fused RoPE kernel exists."""
    from megatron.core.transformer import transformer_config as configs

    mla = kwargs.get("multi_latent_attention", False) or "kv_lora_rank" in kwargs
    config_class = configs.MLATransformerConfig if mla else configs.TransformerConfig
    return config_class(**{**kwargs, "apply_rope_fusion": False})


def test_transformer_engine_takes_megatron_lms_fusions_and_attention() -> None:
    from megatron.core.transformer.enums import AttnBackend

    kwargs = _kwargs(_plan())
    expected = {
        "transformer_impl": "transformer_engine",
        "attention_backend": AttnBackend.auto,  # TE picks its flash or cuDNN fused kernel
        "bias_dropout_fusion": True,
        "apply_rope_fusion": True,
        "masked_softmax_fusion": True,
        "persist_layer_norm": True,
        "cp_comm_type": "p2p",
        "params_dtype": torch.bfloat16,
        "bf16": True,
        "fp16": False,
    }
    assert {k: kwargs[k] for k in expected} == expected
    assert "fp8" not in kwargs and "moe_grouped_gemm" not in kwargs
    config = _built(kwargs)
    assert (config.transformer_impl, config.fp8, config.attention_backend) == (
        "transformer_engine",
        None,
        AttnBackend.auto,
    )


def test_gradient_accumulation_fusion_only_where_its_kernel_is_installed() -> None:
    """The file asks for it as Megatron-LM does on the TE path; the runtime turns it off without APEX's kernel."""
    plan = _plan()
    assert megatron_config(plan)["transformer_config"]["gradient_accumulation_fusion"] is True
    assert _kwargs(plan)["gradient_accumulation_fusion"] is wgrad_fusion_kernel()


def test_flash_attention_off_stores_the_scores_with_tes_unfused_attention() -> None:
    from megatron.core.transformer.enums import AttnBackend

    assert _kwargs(_plan("train.flash_attention=false"))["attention_backend"] is AttnBackend.unfused


@pytest.mark.parametrize(
    ("recipe", "fp8", "fp8_recipe"), [("delayed", "hybrid", "delayed"), ("blockwise", "e4m3", "blockwise")]
)
def test_fp8_recipes_are_megatron_lms_format_and_recipe(recipe: str, fp8: str, fp8_recipe: str) -> None:
    kwargs = _kwargs(_plan("train.precision=fp8", f"train.fp8_recipe={recipe}"))
    assert (kwargs["fp8"], kwargs["fp8_recipe"]) == (fp8, fp8_recipe)
    config = _built(kwargs)
    # weights, activations and 16-bit gradients stay bf16; TE runs the GEMMs in FP8
    assert (config.fp8, config.fp8_recipe, config.bf16, config.params_dtype) == (fp8, fp8_recipe, True, torch.bfloat16)
    assert (config.fp8_amax_history_len, config.fp8_amax_compute_algo, config.fp8_margin) == (1, "most_recent", 0)


def test_moe_on_transformer_engine_runs_grouped_gemm_experts_and_mla_keeps_plain_rope() -> None:
    kwargs = _kwargs(_plan("model=tiny_moe"))
    assert kwargs["moe_grouped_gemm"] is True  # the capability table: grouped_gemm_experts runs here
    assert kwargs["moe_token_dispatcher_type"] == "alltoall"
    assert kwargs["apply_rope_fusion"] is False  # megatron-core 0.16.1 fuses MLA's RoPE only for YaRN
    config = _built(kwargs)
    assert config.moe_grouped_gemm and config.multi_latent_attention


def test_context_parallel_degree_reaches_the_config() -> None:
    plan = _plan("hardware.gpus_per_node=2", "parallel.cp=2")
    assert plan.trained().layout.cp == 2
    assert _kwargs(plan)["context_parallel_size"] == 2


def test_the_local_path_keeps_megatron_cores_pure_pytorch_settings() -> None:
    plan = make_plan(["model=tiny_moe"], None)  # hardware=cpu: transformer_impl=local
    kwargs = _kwargs(plan)
    fusions = ("bias_dropout_fusion", "apply_rope_fusion", "masked_softmax_fusion", "persist_layer_norm")
    assert kwargs["transformer_impl"] == "local"
    assert not any(kwargs[k] for k in (*fusions, "gradient_accumulation_fusion"))
    assert "attention_backend" not in kwargs and "cp_comm_type" not in kwargs and "moe_grouped_gemm" not in kwargs
    config = transformer_config(megatron_config(plan), parallel=False)
    assert (config.transformer_impl, config.moe_grouped_gemm, config.params_dtype) == ("local", False, torch.float32)


def test_transformer_engine_hands_megatron_lms_builder_its_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    """Megatron-LM's gpt_builders: get_gpt_decoder_block_spec(config, use_transformer_engine=True,
    normalization=...) and the spec as it comes back, none of the local path's stand-ins."""
    from megatron.core.models.gpt import gpt_layer_specs

    calls: list[tuple[Any, dict[str, Any]]] = []
    returned = gpt_layer_specs.TransformerBlockSubmodules(layer_specs=[], layer_norm=None)

    def builder(config: Any, **kwargs: Any) -> Any:
        calls.append((config, kwargs))
        return returned

    monkeypatch.setattr(gpt_layer_specs, "get_gpt_decoder_block_spec", builder)
    config = _built(_kwargs(_plan("model=tiny_moe")))
    assert decoder_block_spec(config, pp_rank=0) is returned
    expected = {"use_transformer_engine": True, "normalization": "RMSNorm", "vp_stage": None, "pp_rank": 0}
    assert calls == [(config, expected)]
    assert returned.layer_norm is None  # untouched


@pytest.mark.skipif(HAVE_TE, reason="Transformer Engine is installed: its layer spec builds")
def test_megatron_core_cannot_build_the_te_layer_spec_without_te() -> None:
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec

    with pytest.raises(NameError, match="TESpecProvider"):
        get_gpt_layer_with_transformer_engine_spec()
