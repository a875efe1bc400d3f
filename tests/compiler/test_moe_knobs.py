"""train.moe and train.megatron.extra: each knob reaches megatron/config.json under megatron-core's field
name, each one a target cannot run is refused with the key and the fix, megatron-core's own asserts are
said first with the keys, and extra fields are checked against megatron-core's dataclasses, then merged."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers.build import compile_build
from helpers.torchrun import run

from lmspec.compiler.backends.megatron_config import megatron_config
from lmspec.compiler.build.files import MEGATRON_CONFIG
from lmspec.compiler.build.reader import Build
from lmspec.compiler.pipeline import derive_despite_rules, make_plan
from lmspec.compiler.rules.megatron_extra import FIELD_KEYS
from lmspec.compiler.spec.shown_key import value_at
from lmspec.runtime.train.megatron.config import ddp_config, optimizer_config, transformer_config

MOE = ["model=tiny_moe"]  # hardware=cpu: 2 ranks over gloo, transformer_impl=local
# two H200s with Transformer Engine: the GPU target, experts over both
GPU = ["hardware=h200_141g", "hardware.gpus_per_node=2", "train.seq_length=1024", "serve.max_model_len=1024"]
GPU_MOE = [*MOE, *GPU, "train.global_batch_size=8", "parallel.ep=2"]


def _document(overrides: list[str]) -> dict[str, Any]:
    """megatron/config.json as the build holds it (JSON, read back)."""
    return json.loads(json.dumps(megatron_config(make_plan(overrides, None))))


def _problems(overrides: list[str]) -> list[str]:
    return [p.line() for p in derive_despite_rules(overrides).problems]


@pytest.mark.parametrize(
    ("overrides", "fields"),
    [
        pytest.param([], {"moe_token_dispatcher_type": "alltoall", "moe_router_dtype": "fp32"}, id="defaults"),
        pytest.param(
            ["train.moe.dispatcher=allgather"], {"moe_token_dispatcher_type": "allgather"}, id="dispatcher-allgather"
        ),
        pytest.param(
            ["train.moe.load_balancing=seq_aux_loss", "train.moe.aux_loss_coeff=0.0001"],
            {"moe_router_load_balancing_type": "seq_aux_loss", "moe_aux_loss_coeff": 0.0001},
            id="seq-aux-loss-beside-the-bias",  # DeepSeek-V3's: both
        ),
        pytest.param(
            ["train.moe.load_balancing=auto", "train.moe.aux_loss_coeff=0.01"],
            {"moe_router_load_balancing_type": "none", "moe_aux_loss_coeff": 0.0},
            id="auto-is-none-with-the-score-bias",
        ),
        pytest.param(
            ["train.moe.bias_update_rate=0.002"], {"moe_router_bias_update_rate": 0.002}, id="bias-update-rate"
        ),
        pytest.param(
            ["train.moe.capacity_factor=1.25", "train.moe.drop_policy=position", "train.moe.pad_to_capacity=true"],
            {
                "moe_expert_capacity_factor": 1.25,
                "moe_token_drop_policy": "position",
                "moe_pad_expert_input_to_capacity": True,
            },
            id="capacity-and-drop-policy",
        ),
        pytest.param(["train.moe.router_dtype=fp64"], {"moe_router_dtype": "fp64"}, id="router-fp64"),
        pytest.param(["train.moe.router_dtype=null"], {"moe_router_dtype": None}, id="router-model-dtype"),
        pytest.param(["train.moe.force_balance=true"], {"moe_router_force_load_balancing": True}, id="force-balance"),
    ],
)
def test_each_knob_reaches_the_config_and_megatron_core_builds_it(overrides: list[str], fields: dict) -> None:
    document = _document([*MOE, *overrides])
    section = document["transformer_config"]
    assert {k: section[k] for k in fields} == fields
    config = transformer_config(document, parallel=False)  # megatron-core's own __post_init__ checks
    assert {k: getattr(config, k) for k in fields} == fields


@pytest.mark.parametrize(
    ("overrides", "fields"),
    [
        pytest.param(
            ["train.moe.dispatcher=flex", "train.moe.flex_backend=hybridep"],
            {"moe_token_dispatcher_type": "flex", "moe_flex_dispatcher_backend": "hybridep"},
            id="flex-hybridep",
        ),
        pytest.param(["train.moe.permute_fusion=true"], {"moe_permute_fusion": True}, id="permute-fusion"),
        pytest.param(["train.moe.grouped_gemm=false"], {"moe_grouped_gemm": False}, id="grouped-gemm-off"),
        pytest.param([], {"moe_grouped_gemm": True}, id="grouped-gemm-auto-where-te-runs-it"),
        pytest.param(
            ["train.moe.shared_expert_overlap=true"], {"moe_shared_expert_overlap": True}, id="shared-expert-overlap"
        ),
    ],
)
def test_gpu_knobs_reach_the_config(overrides: list[str], fields: dict) -> None:
    section = _document([*GPU_MOE, *overrides])["transformer_config"]
    assert {k: section[k] for k in fields} == fields


def test_a_dense_model_writes_no_moe_training_setting() -> None:
    section = _document([])["transformer_config"]
    assert not any(k.startswith("moe_") for k in section)


REFUSED = [
    pytest.param(
        [*MOE, "train.moe.dispatcher=flex", "train.moe.flex_backend=deepep"],
        ['train.moe.dispatcher="flex" (command-line override) needs GPU hardware', "DeepEP and HybridEP kernels"],
        ["or set train.moe.dispatcher=alltoall"],
        id="flex-on-cpu",
    ),
    pytest.param(
        [*MOE, "train.moe.permute_fusion=true"],
        ["train.moe.permute_fusion=true (command-line override) needs GPU hardware"],
        ["Transformer Engine's", "or set train.moe.permute_fusion=false"],
        id="permute-fusion-on-cpu",
    ),
    pytest.param(
        [*GPU_MOE, "train.transformer_impl=local", "train.moe.permute_fusion=true"],
        ["train.moe.permute_fusion=true (command-line override) needs train.transformer_impl=transformer_engine"],
        ["permutes with torch ops"],
        id="permute-fusion-on-the-local-layers",
    ),
    pytest.param(
        [*MOE, "train.moe.grouped_gemm=true"],
        ["train.moe.grouped_gemm=true (command-line override) needs GPU hardware"],
        ["SequentialMLP", "or set train.moe.grouped_gemm=auto"],
        id="grouped-gemm-on-cpu",
    ),
    pytest.param(
        [*MOE, "train.moe.shared_expert_overlap=true"],
        ["train.moe.shared_expert_overlap=true (command-line override) needs GPU hardware"],
        ["CUDA side stream"],
        id="shared-expert-overlap-on-cpu",
    ),
    *[
        pytest.param(
            [*MOE, "train.backend=deepspeed", override],
            [f"{override.split('=')[0]}=", "needs train.backend=megatron", why],
            [],
            id=f"deepspeed-{override.split('.')[-1].split('=')[0]}",
        )
        for override, why in [
            ("train.moe.dispatcher=allgather", "route and loop over their experts in place: no token dispatcher"),
            ("train.moe.load_balancing=seq_aux_loss", "adds no load-balancing loss"),
            ("train.moe.aux_loss_coeff=0.01", "adds no load-balancing loss"),
            ("train.moe.bias_update_rate=0.01", "keeps the expert score bias fixed"),
            ("train.moe.capacity_factor=1.5", "dropless"),
            ("train.moe.router_dtype=fp64", "route in the model's dtype"),
            ("train.moe.force_balance=true", "no forced-balance benchmark mode"),
        ]
    ],
    pytest.param(
        [*GPU_MOE, "train.moe.dispatcher=flex"],
        ['train.moe.dispatcher="flex" (command-line override) needs its kernels, but train.moe.flex_backend=null'],
        ["set train.moe.flex_backend=deepep (DeepEP) or hybridep"],
        id="flex-needs-a-backend",
    ),
    pytest.param(
        [*MOE, "train.moe.flex_backend=deepep"],
        ['train.moe.flex_backend="deepep" (command-line override) does nothing with train.moe.dispatcher="alltoall"'],
        ["set train.moe.flex_backend=null, or train.moe.dispatcher=flex"],
        id="flex-backend-without-flex",
    ),
    pytest.param(
        [*GPU_MOE, "parallel.ep=1", "train.moe.dispatcher=flex", "train.moe.flex_backend=deepep"],
        ["TPxEP > 1", "parallel.tp(1) x parallel.ep(1) = 1"],
        ["set parallel.ep=2"],
        id="flex-needs-tp-x-ep",
    ),
    pytest.param(
        [*GPU_MOE, "train.moe.dispatcher=flex", "train.moe.flex_backend=deepep", "train.moe.capacity_factor=1.0"]
        + ["train.moe.pad_to_capacity=true"],
        ["train.moe.pad_to_capacity=true (command-line override): megatron-core's flex dispatcher with"],
        ["or train.moe.flex_backend=hybridep"],
        id="deepep-does-not-pad",
    ),
    pytest.param(
        [*MOE, "train.moe.pad_to_capacity=true"],
        ["train.moe.pad_to_capacity=true (command-line override) pads", "train.moe.capacity_factor=null"],
        ["set train.moe.capacity_factor (e.g. 1.25) or train.moe.pad_to_capacity=false"],
        id="pad-needs-a-capacity",
    ),
    pytest.param(
        [*MOE, "train.moe.drop_policy=position"],
        ['train.moe.drop_policy="position" (command-line override) does nothing with train.moe.capacity_factor=null'],
        ["or train.moe.drop_policy=probs"],
        id="drop-policy-needs-a-capacity",
    ),
    pytest.param(
        [*GPU_MOE, "train.moe.shared_expert_overlap=true", "train.moe.dispatcher=allgather"],
        ["train.moe.shared_expert_overlap=true (command-line override) runs the shared experts during the all-to-all"],
        ["set train.moe.dispatcher=alltoall or train.moe.shared_expert_overlap=false"],
        id="shared-expert-overlap-needs-alltoall",
    ),
    pytest.param(
        [*GPU_MOE, "train.moe.shared_expert_overlap=true", "model.moe.num_shared_experts=0"],
        ["overlaps the shared experts, but model.moe.num_shared_experts=0 (command-line override)"],
        ["set train.moe.shared_expert_overlap=false"],
        id="shared-expert-overlap-needs-shared-experts",
    ),
    pytest.param(
        [*GPU_MOE, "train.moe.shared_expert_overlap=true", "parallel.overlap.moe_a2a=true"],
        ["train.moe.shared_expert_overlap=true (command-line override) and parallel.overlap.moe_a2a=true"],
        ["megatron-core refuses the two together"],
        id="shared-expert-overlap-not-with-a2a-overlap",
    ),
    pytest.param(
        [*GPU_MOE, "train.moe.dispatcher=allgather", "parallel.overlap.moe_a2a=true"],
        ["parallel.overlap.moe_a2a=true (command-line override) overlaps the alltoall or flex dispatcher's"],
        ["set train.moe.dispatcher=alltoall or parallel.overlap.moe_a2a=false"],
        id="a2a-overlap-needs-an-all-to-all",
    ),
    pytest.param(
        [*MOE, "+train.megatron.extra.transformer_config.moe_z_los_coeff=0.001"],
        [
            "error: train.megatron.extra.transformer_config.moe_z_los_coeff=0.001 (command-line override): "
            "megatron-core's MLATransformerConfig has no field moe_z_los_coeff"
        ],
        ["did you mean moe_z_loss_coeff"],
        id="extra-unknown-field",
    ),
    pytest.param(
        [*MOE, "+train.megatron.extra.transformer_config.moe_z_loss_coeff=high"],
        ['train.megatron.extra.transformer_config.moe_z_loss_coeff="high" (command-line override)'],
        ["MLATransformerConfig.moe_z_loss_coeff takes float | null, not this value"],
        id="extra-mistyped-value",
    ),
    pytest.param(
        ["+train.megatron.extra.transformer_config.num_layers=8"],
        ["train.megatron.extra.transformer_config.num_layers=8 (command-line override): lmspec sets"],
        ["TransformerConfig.num_layers itself: lmspec writes it from model.num_layers; set model.num_layers instead"],
        id="extra-lmspec-owned-field",
    ),
    pytest.param(
        [*MOE, "+train.megatron.extra.transformer_config.moe_router_dtype=fp64"],
        ["moe_router_dtype itself: lmspec writes it from train.moe.router_dtype; set train.moe.router_dtype instead"],
        [],
        id="extra-a-knob-of-train-moe",
    ),
    pytest.param(
        ["+train.megatron.extra.transformer_config.hidden_dropout=0.1"],
        ["TransformerConfig.hidden_dropout itself: lmspec writes it for this build"],
        [],
        id="extra-a-field-lmspec-fixes",
    ),
    pytest.param(
        ["+train.megatron.extra.transformer_config.use_cpu_initialization=true"],
        ["the trainer decides it on the machine it runs on"],
        [],
        id="extra-a-field-the-runtime-decides",
    ),
    pytest.param(
        ["+train.megatron.extra.ddp.bucket_size=1000"],
        ["DistributedDataParallelConfig.bucket_size itself", "set parallel.overlap.grad_reduce instead"],
        [],
        id="extra-ddp-owned",
    ),
    pytest.param(
        ["+train.megatron.extra.optimizer.adam_eps=0.1"],
        ["OptimizerConfig.adam_eps itself"],
        ["set train.optimizer.eps instead"],
        id="extra-optimizer-owned",
    ),
    pytest.param(
        ["+train.megatron.extra.optimizer.decoupled_lr=fast"],
        ['train.megatron.extra.optimizer.decoupled_lr="fast" (command-line override)'],
        ["OptimizerConfig.decoupled_lr takes float | null, not this value"],
        id="extra-optimizer-mistyped",
    ),
    pytest.param(
        ["+train.megatron.extra.optimizer.main_grads_dtype=float32"],
        ["OptimizerConfig.main_grads_dtype takes dtype, not this value"],
        [],
        id="extra-no-json-value-is-a-dtype",
    ),
    pytest.param(
        ["train.backend=deepspeed", "+train.megatron.extra.ddp.average_in_collective=true"],
        ["train.megatron.extra.ddp.average_in_collective=true (command-line override) sets a megatron-core field"],
        ["builds no megatron-core objects (no megatron/config.json): set train.megatron.extra={}"],
        id="extra-with-deepspeed",
    ),
    pytest.param(
        ["++train.megatron.extra={transformer:{moe_z_loss_coeff:0.001}}"],
        ["train.megatron.extra.transformer (command-line override): unknown key; did you mean"],
        ["transformer_config"],
        id="extra-unknown-section",
    ),
]


@pytest.mark.parametrize(("overrides", "expected", "fix"), REFUSED)
def test_refusals_name_the_key_and_the_fix(overrides: list[str], expected: list[str], fix: list[str]) -> None:
    errors = [line for line in _problems(overrides) if line.startswith("error:")]
    matching = [line for line in errors if all(s in line for s in expected)]
    assert matching, errors
    assert any(all(s in line for s in fix) for line in matching), matching


def test_a_mapping_override_without_plus_plus_is_told_how(lmspec) -> None:
    """Hydra merges `key={...}` into the mapping the spec holds (empty here) and refuses its new keys."""
    result = lmspec("check", "train.megatron.extra={transformer_config:{moe_z_loss_coeff:0.001}}")
    result.assert_reports(
        1,
        [
            "train.megatron.extra (command-line override): a mapping given this way may only set keys",
            "replace it whole with ++train.megatron.extra={transformer_config:{moe_z_loss_coeff:0.001}}",
        ],
    )


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        pytest.param(
            ["train.moe.dispatcher=allgather"],
            'warning: train.moe.dispatcher="allgather" (command-line override) does nothing: model.moe=null',
            id="dense-model",
        ),
        pytest.param(
            [*MOE, "train.moe.force_balance=true"],
            "warning: train.moe.force_balance=true (command-line override) routes tokens by random logits",
            id="force-balance-is-a-benchmark",
        ),
        pytest.param(
            [*MOE, "train.moe.aux_loss_coeff=0.01"],
            "warning: train.moe.aux_loss_coeff=0.01 (command-line override) does nothing",
            id="aux-coeff-without-aux-loss",
        ),
        pytest.param(
            ["model=mixtral_8x7b", "hardware=h100_80g", "train.moe.bias_update_rate=0.01"],
            "warning: train.moe.bias_update_rate=0.01 (command-line override) does nothing without",
            id="bias-rate-without-the-bias",
        ),
    ],
)
def test_settings_that_do_nothing_are_warned(overrides: list[str], expected: str) -> None:
    assert any(line.startswith(expected) for line in _problems(overrides)), _problems(overrides)


def test_extra_is_merged_last_and_megatron_core_builds_the_sections(tmp_path: Path) -> None:
    extra = (
        "++train.megatron.extra={transformer_config:{moe_z_loss_coeff:0.001,moe_per_layer_logging:true},"
        "ddp:{average_in_collective:true},optimizer:{decoupled_weight_decay:false}}"
    )
    build = compile_build(tmp_path, [*MOE, extra]).dir
    document = json.loads((build / MEGATRON_CONFIG).read_text())
    assert document["transformer_config"]["moe_z_loss_coeff"] == 0.001
    assert document["transformer_config"]["moe_per_layer_logging"] is True
    assert document["ddp"]["average_in_collective"] is True
    assert document["optimizer"]["decoupled_weight_decay"] is False
    config = transformer_config(document, parallel=False)
    assert (config.moe_z_loss_coeff, config.moe_per_layer_logging) == (0.001, True)
    assert ddp_config(document).average_in_collective is True
    assert optimizer_config(document).decoupled_weight_decay is False
    # the build's own reading of its spec: the extra mapping round-trips through spec.resolved.yaml, frozen
    spec = Build.open(build).training()
    assert spec.train.megatron.extra["ddp"] == {"average_in_collective": True}
    assert hash(spec) == hash(make_plan([*MOE, extra], None).trained().spec)
    with pytest.raises(TypeError, match="read-only"):
        spec.train.megatron.extra["ddp"]["bucket_size"] = 1  # type: ignore[index]


def test_every_field_key_is_a_spec_key_and_every_field_megatron_cores() -> None:
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.transformer.transformer_config import MLATransformerConfig

    spec = make_plan([*MOE, "model.rope_scaling.type=yarn"], None).trained().spec
    classes = {"transformer_config": MLATransformerConfig, "ddp": DistributedDataParallelConfig}
    classes["optimizer"] = OptimizerConfig
    for section, table in FIELD_KEYS.items():
        fields = {f.name for f in dataclasses.fields(classes[section])}
        assert set(table) <= fields, (section, set(table) - fields)
        for key in set(table.values()):
            value_at(spec, key)  # raises AttributeError on a key the spec does not have


def test_a_spec_without_extra_compiles_without_importing_megatron_core(tmp_path: Path) -> None:
    code = (
        "import sys; from pathlib import Path; sys.path.insert(0, 'tests'); from helpers.build import compile_build; "
        f"compile_build(Path({str(tmp_path)!r}), ['model=tiny_moe', 'train.moe.dispatcher=allgather']); "
        "print('megatron' in sys.modules)"
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr[-2000:]


@pytest.mark.slow
def test_the_allgather_dispatcher_trains_on_two_cpu_ranks(tmp_path: Path) -> None:
    """A knob honoured by the runtime: tiny_moe with EP=2 over megatron-core's all-gather dispatcher."""
    overrides = ["name=allgather", *MOE, "parallel.ep=2", "train.moe.dispatcher=allgather"]
    overrides += ["train.steps=3", "train.checkpoint.interval=3", "train.log_interval=1", "train.eval_iters=0"]
    build = compile_build(tmp_path / "build", overrides).dir
    assert json.loads((build / MEGATRON_CONFIG).read_text())["transformer_config"]["moe_token_dispatcher_type"] == (
        "allgather"
    )
    result = run(build, tmp_path)
    assert result.code == 0, result.output[-4000:]
    losses = result.losses("allgather")
    assert sorted(losses) == [1, 2, 3] and all(math.isfinite(loss) for loss in losses.values()), losses
