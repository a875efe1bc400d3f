"""Each low-precision recipe runs or is refused by the capability table, on every GPU generation lmspec
has a preset for; what it runs compiles to a megatron/config.json megatron-core's TransformerConfig accepts;
the TE preflight holds the installed Transformer Engine to the recipe's release.

Which generation runs which recipe, as the vendors' software states it (written out here, apart from
compiler/models/recipes.py, so a change to the table is a change to this test): per-tensor FP8 on Ada,
Hopper, Blackwell and AMD CDNA3/CDNA4 (ROCm's TE: delayed and current scaling); DeepSeek-V3's blocks on
Hopper and Blackwell; MXFP8 on Blackwell and CDNA4; NVFP4 on Blackwell only.
"""

from __future__ import annotations

import json
import sys
import types

import pytest
from helpers.specs import spec_of

from lmspec.compiler.backends.megatron_config import megatron_config
from lmspec.compiler.inputs import read_inputs
from lmspec.compiler.models.recipes import RECIPES
from lmspec.compiler.pipeline import make_plan
from lmspec.compiler.rules import rule_problems
from lmspec.compiler.spec.provenance import Origins
from lmspec.runtime.train.megatron.config import transformer_config_kwargs
from lmspec.runtime.train.te_preflight import _check_recipe

PRESETS = {
    "ampere": "a100_80g",
    "ada": "rtx4090_24g",
    "hopper": "h100_80g",
    "blackwell": "b200_180g",
    "cdna3": "mi300x_192g",
    "cdna4": "mi355x_288g",
}
PER_TENSOR = {"ada", "hopper", "blackwell", "cdna3", "cdna4"}
RUNS = {
    "delayed": PER_TENSOR,
    "tensorwise": PER_TENSOR,
    "blockwise": {"hopper", "blackwell"},
    "mxfp8": {"blackwell", "cdna4"},
    "nvfp4": {"blackwell"},
}
JOB = ["hardware.gpus_per_node=1", "train.seq_length=1024", "serve.max_model_len=1024", "train.global_batch_size=8"]
# megatron-core's TransformerConfig fields per recipe: Megatron-Bridge's mixed-precision presets
# (bf16_with_fp8_delayed_scaling_mixed, _current_scaling_mixed, bf16_with_mxfp8_mixed, bf16_with_nvfp4_mixed)
# and DeepSeek-V3's all-e4m3 blocks
CONFIG = {
    "delayed": {"fp8": "hybrid", "fp8_recipe": "delayed", "fp4": None},
    "tensorwise": {"fp8": "hybrid", "fp8_recipe": "tensorwise", "fp4": None},
    "blockwise": {"fp8": "e4m3", "fp8_recipe": "blockwise", "fp4": None},
    "mxfp8": {"fp8": "e4m3", "fp8_recipe": "mxfp8", "fp4": None},
    "nvfp4": {"fp8": None, "fp4": "e2m1", "fp4_recipe": "nvfp4"},
}


def _asks(recipe: str) -> list[str]:
    r = RECIPES[recipe]
    return [f"train.precision={r.precision}", f"{r.key}={recipe}"]


def _errors(*overrides: str) -> list[tuple[str, str]]:
    spec = spec_of(*JOB, *overrides)
    return [(p.key, p.message) for p in rule_problems(spec, Origins(), read_inputs(spec)) if p.severity == "error"]


def test_the_table_covers_the_recipes_megatron_core_names() -> None:
    from megatron.core.enums import Fp4Recipe, Fp8Recipe

    assert set(RUNS) == set(RECIPES) == {r.value for r in (*Fp8Recipe, *Fp4Recipe)} - {"custom"}


@pytest.mark.parametrize("generation", sorted(PRESETS))
@pytest.mark.parametrize("recipe", sorted(RUNS))
def test_each_recipe_runs_where_its_generation_does_and_is_refused_elsewhere(recipe: str, generation: str) -> None:
    hardware = f"hardware={PRESETS[generation]}"
    assert _errors(hardware) == []  # the bf16 job runs on every preset
    errors = _errors(hardware, *_asks(recipe))
    if generation in RUNS[recipe]:
        assert errors == []
        return
    # refused once: on the recipe's key with the generation's reason, or on train.precision where the part has
    # no tensor cores of the precision at all (A100's FP8, MI300X's FP4)
    assert len(errors) == 1, errors
    key, message = errors[0]
    r = RECIPES[recipe]
    if key == r.key:
        assert f'hardware.gpu.generation="{generation}"' in message
        assert f"Transformer Engine >= {r.te_version}" in message
    else:
        assert key == "train.precision" and f"hardware.gpu.{r.precision}_tflops=null" in message


@pytest.mark.parametrize("recipe", sorted(RUNS))
def test_the_cpu_target_and_deepspeed_refuse_every_recipe_on_train_precision(recipe: str) -> None:
    cpu = _errors("hardware=cpu", *_asks(recipe))
    assert [k for k, _ in cpu] == ["train.precision"] and "no CPU target runs it" in cpu[0][1]
    deepspeed = ["train.backend=deepspeed", "train.transformer_impl=local", "train.recompute=full"]
    refused = _errors("hardware=b200_180g", *deepspeed, *_asks(recipe))
    assert [k for k, _ in refused] == ["train.precision"]
    assert "needs train.backend=megatron and train.transformer_impl=transformer_engine" in refused[0][1]


@pytest.mark.parametrize("recipe", sorted(RUNS))
def test_megatron_core_accepts_every_recipes_config(recipe: str) -> None:
    """On a generation that runs it, the build's megatron/config.json, read back, builds megatron-core's own
    TransformerConfig with the recipe's fields (RoPE fusion off: megatron-core checks TE's kernel exists)."""
    from megatron.core.transformer import transformer_config as configs

    generation = "blackwell" if "blackwell" in RUNS[recipe] else sorted(RUNS[recipe])[0]
    plan = make_plan([f"hardware={PRESETS[generation]}", *JOB, *_asks(recipe)], None)
    document = json.loads(json.dumps(megatron_config(plan)))
    kwargs = transformer_config_kwargs(document)
    config = getattr(configs, document["transformer_config"]["class"])(**{**kwargs, "apply_rope_fusion": False})
    assert {k: getattr(config, k) for k in CONFIG[recipe]} == CONFIG[recipe]
    assert (config.bf16, str(config.params_dtype)) == (True, "torch.bfloat16")  # master copies stay bf16


def _fake_transformer_engine(monkeypatch: pytest.MonkeyPatch, version: str, supported: bool) -> None:
    """A stand-in for the transformer_engine package (not installed here): its version and TE's own per-GPU
    verdict, the two things the preflight reads."""
    te, pytorch, fp8 = (types.ModuleType(n) for n in ("transformer_engine", "transformer_engine.pytorch", "fp8"))
    te.__version__ = version  # type: ignore[attr-defined]
    for name in ("check_fp8_support", "check_fp8_block_scaling_support", "check_mxfp8_support", "check_nvfp4_support"):
        setattr(fp8, name, lambda: (supported, "Device compute capability 10.0 or higher required"))
    monkeypatch.setitem(sys.modules, "transformer_engine", te)
    monkeypatch.setitem(sys.modules, "transformer_engine.pytorch", pytorch)
    monkeypatch.setitem(sys.modules, "transformer_engine.pytorch.fp8", fp8)


def test_the_preflight_refuses_a_transformer_engine_older_than_the_recipe(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_transformer_engine(monkeypatch, "2.5.0", supported=True)
    assert _check_recipe(RECIPES["mxfp8"]) == []  # 2.1.0 and later
    (problem,) = _check_recipe(RECIPES["nvfp4"])
    assert problem.key == "train.fp4_recipe"
    assert "needs Transformer Engine >= 2.7.0.dev0" in problem.message and "2.5.0 is installed" in problem.message


def test_the_preflight_passes_on_tes_verdict_for_this_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_transformer_engine(monkeypatch, "2.8.0", supported=False)
    (problem,) = _check_recipe(RECIPES["mxfp8"])
    assert problem.key == "train.fp8_recipe"
    assert "cannot run on this GPU: Device compute capability 10.0 or higher required" in problem.message
