"""Bytes per checkpoint save, the disk keep_last_k saves hold and the save time (compiler/models/checkpoint_size.py),
asserted from the published parameter counts and the bytes each backend writes per parameter."""

from __future__ import annotations

import pytest
from helpers.specs import spec_of

from lmspec.compiler.models.checkpoint_size import MANIFEST_HASH_BYTES_PER_S, checkpoint_size
from lmspec.compiler.spec.sections import training

DEEPSEEK = ["model=deepseek_v3", "hardware=h800_80g", "hardware.nodes=256", "parallel.pp=16", "parallel.ep=64"]
# DeepSeek-V3: 671.03 B parameters in the model (its published 671 B) plus 11.61 B in its MTP module,
# which Megatron trains and saves with it (embedding and head shared, saved once).
DEEPSEEK_PARAMS = 671.03e9 + 11.61e9


def _size(*overrides: str):
    spec = training(spec_of(*overrides))
    assert spec is not None
    return checkpoint_size(spec)


def test_deepseek_v3_bf16_adam_writes_14_bytes_per_parameter_with_its_mtp_module() -> None:
    c = _size(*DEEPSEEK)
    # bf16 weights 2 + fp32 master 4 + Adam exp_avg 4 + exp_avg_sq 4
    assert (c.weight_bytes_per_param, c.master_bytes_per_param, c.moment_bytes_per_param) == (2, 4, 8)
    assert c.moments == 2 and c.bytes_per_param == 14
    assert c.params == pytest.approx(DEEPSEEK_PARAMS, rel=1e-4)
    assert c.bytes_per_save == pytest.approx(DEEPSEEK_PARAMS * 14, rel=1e-4)  # ~9.56 TB
    assert 9.55e12 < c.bytes_per_save < 9.56e12
    assert 671.03e9 * 14 == pytest.approx(9.394e12, rel=1e-3)  # the model alone: the ~9.4 TB usually quoted


def test_keep_last_k_saves_are_kept_and_one_more_is_written_before_pruning() -> None:
    c = _size(*DEEPSEEK, "train.checkpoint.keep_last_k=3")
    assert c.saves_kept == 3
    assert c.kept_bytes == 3 * c.bytes_per_save
    assert c.peak_bytes == 4 * c.bytes_per_save


def test_save_time_is_the_write_at_the_storage_bandwidth_plus_rank_0s_manifest_hash() -> None:
    c = _size(*DEEPSEEK, "cluster.storage_write_gb_per_s=10", "cluster.nccl.timeout_minutes=30")
    assert c.write_s == pytest.approx(DEEPSEEK_PARAMS * 14 / 10e9, rel=1e-4)  # ~956 s
    assert c.manifest_s == pytest.approx(DEEPSEEK_PARAMS * 14 / MANIFEST_HASH_BYTES_PER_S, rel=1e-4)
    assert c.save_s == c.write_s + c.manifest_s
    assert c.timeout_s == 1800 and c.outlasts_timeout


@pytest.mark.parametrize(
    ("overrides", "weights", "optimizer"),
    [
        pytest.param(["train.precision=fp32"], 4, 8, id="fp32-no-master-copy"),
        pytest.param(["model=llama3_8b", "hardware=h100_80g", "train.precision=bf16"], 2, 12, id="megatron-bf16"),
        pytest.param(
            ["model=llama3_8b", "hardware=h100_80g", "train.precision=fp8", "train.fp8_recipe=delayed"],
            2,
            12,
            id="fp8-saves-bf16-weights",
        ),
        pytest.param(["model=llama3_8b", "hardware=h100_80g", "train.optimizer.name=sgd"], 2, 8, id="sgd-one-moment"),
        pytest.param(
            ["model=llama3_8b", "hardware=h100_80g", "train.backend=deepspeed", "parallel.zero_stage=1"],
            2,
            12,
            id="deepspeed-zero1",
        ),
        pytest.param(
            ["model=llama3_8b", "hardware=h100_80g", "train.backend=deepspeed", "parallel.zero_stage=3"],
            0,
            12,
            id="deepspeed-zero3-no-16bit-weights",
        ),
        pytest.param(
            ["train.backend=deepspeed", "parallel.zero_stage=3", "train.precision=fp32"],
            0,
            12,
            id="deepspeed-zero3-fp32-partitions-are-the-weights",
        ),
    ],
)
def test_bytes_per_parameter_by_backend_precision_and_optimizer(
    overrides: list[str], weights: int, optimizer: int
) -> None:
    c = _size(*overrides)
    assert (c.weight_bytes_per_param, c.optimizer_bytes_per_param) == (weights, optimizer)
    assert c.bytes_per_save == c.params * (weights + optimizer)


def test_the_layout_does_not_change_what_a_save_writes() -> None:
    base = _size("model=llama3_8b", "hardware=h100_80g")
    sharded = _size("model=llama3_8b", "hardware=h100_80g", "parallel.tp=2", "parallel.distributed_optimizer=true")
    assert base.bytes_per_save == sharded.bytes_per_save
    assert base.bytes_per_save == pytest.approx(8.03e9 * 14, rel=1e-3)  # Llama 3 8B: 8.03 B parameters
