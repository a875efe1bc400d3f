"""megatron/config.json and megatron/pretrain_gpt_args.sh: the Megatron backend's reviewed configuration.

megatron-core judges the document: its TransformerConfig, DistributedDataParallelConfig, OptimizerConfig and
OptimizerParamScheduler are built from it for every shipped Megatron preset and the layouts that change it
(interleaving, MoE, context parallelism, FP8, MXFP8, NVFP4). The Megatron-LM arguments are derived from the
same document: every field of it is either written as a flag or named as derived, shellcheck reads the file,
and where Megatron-LM's own training package is importable its parser turns them back into the same
TransformerConfig.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.build import compile_build

from lmspec.compiler.backends import megatron_args
from lmspec.compiler.backends.megatron_config import megatron_config
from lmspec.compiler.build.files import MEGATRON_ARGS, MEGATRON_CONFIG
from lmspec.compiler.pipeline import make_plan
from lmspec.compiler.plan import Plan
from lmspec.compiler.spec.sections import training
from lmspec.runtime.train.megatron.config import (
    ddp_config,
    optimizer_config,
    param_scheduler,
    transformer_config_kwargs,
)

SPECS = Path(__file__).resolve().parents[2] / "specs"
MEGATRON_PRESETS = sorted(
    p.stem
    for p in SPECS.glob("*.yaml")
    if p.stem != "config" and (t := training(make_plan([], p).spec)) is not None and t.train.backend == "megatron"
)
VARIANTS = {
    "tiny": [],
    "tiny-pp2-interleaved": ["parallel.pp=2", "parallel.virtual_stages=2"],
    "tiny-moe-ep2": ["model=tiny_moe", "parallel.ep=2"],
    "gpu-fp8-cp2": [
        "hardware=h200_141g",
        "hardware.gpus_per_node=2",
        "parallel.cp=2",
        "train.seq_length=1024",
        "serve.max_model_len=1024",
        "train.global_batch_size=8",
        "train.precision=fp8",
        "train.fp8_recipe=blockwise",
    ],
    **{
        f"b200-{recipe}": [
            "hardware=b200_180g",
            "hardware.gpus_per_node=1",
            "train.seq_length=1024",
            "serve.max_model_len=1024",
            "train.global_batch_size=8",
            f"train.precision={precision}",
            f"train.{precision}_recipe={recipe}",
        ]
        for precision, recipe in (("fp8", "mxfp8"), ("fp4", "nvfp4"))
    },
}
DEGREES = (
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "context_parallel_size",
    "expert_model_parallel_size",
    "expert_tensor_parallel_size",
)
LINEAR_ROPE = (
    "model.rope_scaling={type:linear,factor:2.0,original_max_position_embeddings:null,low_freq_factor:null,"
    "high_freq_factor:null,beta_fast:null,beta_slow:null,mscale:null,mscale_all_dim:null}"
)
HAVE_MEGATRON_LM = importlib.util.find_spec("megatron.training") is not None


def _plans() -> list[Any]:
    cases = [pytest.param(preset, [], id=preset) for preset in MEGATRON_PRESETS]
    return cases + [pytest.param(None, overrides, id=name) for name, overrides in VARIANTS.items()]


def _plan(preset: str | None, overrides: list[str]) -> Plan:
    return make_plan(overrides, SPECS / f"{preset}.yaml" if preset else None)


@pytest.mark.parametrize(("preset", "overrides"), _plans())
def test_megatron_core_builds_every_object_from_the_document(preset: str | None, overrides: list[str]) -> None:
    from megatron.core.transformer import transformer_config as configs

    plan = _plan(preset, overrides)
    document = json.loads(json.dumps(megatron_config(plan)))  # what the build file holds, read back
    kwargs = transformer_config_kwargs(document)
    kwargs["apply_rope_fusion"] = False  # megatron-core checks at construction that TE's fused RoPE kernel exists
    config = getattr(configs, document["transformer_config"]["class"])(**kwargs)
    layout = plan.trained().layout
    parallel_state = document["parallel_state"]
    assert (config.tensor_model_parallel_size, config.pipeline_model_parallel_size) == (layout.tp, layout.pp)
    for name in DEGREES:  # the groups megatron-core builds are the degrees the model is configured for
        assert parallel_state[name] == getattr(config, name), name
    assert parallel_state["virtual_pipeline_model_parallel_size"] == config.virtual_pipeline_model_parallel_size
    ddp = ddp_config(document)
    assert ddp.use_distributed_optimizer is layout.distributed_optimizer
    optimizer = optimizer_config(document)
    assert (optimizer.params_dtype, optimizer.bf16) == (config.params_dtype, config.bf16)
    param_scheduler(document, torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0))


def test_every_field_of_the_document_reaches_megatron_lms_arguments() -> None:
    """A field the Megatron-LM arguments neither write nor name as derived would be dropped silently."""
    covered = (
        set(megatron_args.SAME_NAME_VALUES)
        | set(megatron_args.RENAMED_VALUES)
        | set(megatron_args.SWITCHES_ON)
        | set(megatron_args.SWITCHES_OFF)
        | megatron_args.DERIVED
    )
    for preset, overrides in [(p.values[0], p.values[1]) for p in _plans()]:
        document = megatron_config(_plan(preset, overrides))  # type: ignore[arg-type]
        fields = set(document["transformer_config"]) | set(document["parallel"])
        assert fields <= covered, (preset, overrides, sorted(fields - covered))


def test_the_arguments_file_is_quoted_bash_and_names_what_it_cannot_say(tmp_path: Path, shellcheck: str) -> None:
    moe = compile_build(tmp_path / "moe", ["model=tiny_moe"]).dir
    text = (moe / MEGATRON_ARGS).read_text()
    assert "--num-experts 8" in text and "--moe-layer-freq '([0]*1+[1]*3)'" in text
    # the tiny MLA model's YaRN band: Megatron-LM reads no flag for it
    assert "# Not expressible: original_max_position_embeddings=256: Megatron-LM has no flag" in text
    build = compile_build(tmp_path / "build", [LINEAR_ROPE]).dir
    text = (build / MEGATRON_ARGS).read_text()
    assert "# Not expressible: seq_len_interpolation_factor=2.0" in text
    checked = subprocess.run([shellcheck, str(build / MEGATRON_ARGS)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout
    words = subprocess.run(
        ["bash", "-c", f'source {build / MEGATRON_ARGS}; printf "%s\\n" "${{MEGATRON_ARGS[@]}}"'],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert words[:2] == ["--num-layers", "4"] and "--train-iters" in words


def test_a_deepspeed_build_has_no_megatron_configuration(tmp_path: Path) -> None:
    build = compile_build(tmp_path / "build", ["train.backend=deepspeed"]).dir
    assert not (build / MEGATRON_CONFIG).exists() and not (build / MEGATRON_ARGS).exists()


@pytest.mark.skipif(
    not HAVE_MEGATRON_LM,
    reason="Megatron-LM's training package (megatron.training, its arguments.py) is not on the package index: "
    "megatron-core ships without it; checked by hand against core_v0.16.1 (see the issue note)",
)
@pytest.mark.parametrize(("preset", "overrides"), _plans())
def test_megatron_lms_parser_builds_the_same_transformer_config(
    preset: str | None, overrides: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from megatron.training import arguments

    plan = _plan(preset, overrides)
    document = megatron_config(plan)
    args, _ = megatron_args.megatron_lm_args(plan, document)
    monkeypatch.setenv("WORLD_SIZE", str(plan.trained().layout.world_size))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "1")
    data = ["--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "100"]
    monkeypatch.setattr("sys.argv", ["pretrain_gpt.py", *args, *data])
    parsed = arguments.validate_args(arguments.parse_args(), {})
    theirs = arguments.core_transformer_config_from_args(parsed)
    ours = transformer_config_kwargs(document)
    for machine in ("use_cpu_initialization", "gradient_accumulation_fusion"):
        ours.pop(machine)
    assert {k: str(getattr(theirs, k)) for k in ours} == {k: str(v) for k, v in ours.items()}
    assert os.environ["WORLD_SIZE"]
