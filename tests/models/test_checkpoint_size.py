"""Bytes per checkpoint save, the disk keep_last_k saves hold, the save time exposed and overlapped, the host
memory it stages in and the Young/Daly interval (compiler/models/checkpoint_size.py), asserted from the
published parameter counts, the bytes each backend writes per parameter and plain arithmetic."""

from __future__ import annotations

import math

import pytest
from helpers.specs import spec_of

from lmspec.compiler.models.checkpoint_size import checkpoint_cadence, checkpoint_size
from lmspec.compiler.spec.sections import training

DEEPSEEK = ["model=deepseek_v3", "hardware=h800_80g", "hardware.nodes=256", "parallel.pp=16", "parallel.ep=64"]
# DeepSeek-V3: 671.03 B parameters in the model (its published 671 B) plus 11.61 B in its MTP module,
# which Megatron trains and saves with it (embedding and head shared, saved once).
DEEPSEEK_PARAMS = 671.03e9 + 11.61e9
RANKS = 2048
HOPPER_HOST_COPY = 25e9  # PCIe Gen5 x16, two GPUs to one switch uplink (checkpoint_size.HOST_COPY_BYTES_PER_S)
XXH3_128 = 25.8e9  # one core (issue 40's measurement)
LLAMA3_NODE_MTBF_H = 54 * 24 * 2048 / 419  # Llama 3: 419 unexpected interruptions, 54 days, 2,048 nodes


def _training(*overrides: str):
    spec = training(spec_of(*overrides))
    assert spec is not None
    return spec


def _size(*overrides: str):
    return checkpoint_size(_training(*overrides))


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


def test_a_synchronous_save_stops_training_for_the_staging_and_the_whole_persist() -> None:
    c = _size(*DEEPSEEK, "cluster.storage_write_gb_per_s=10", "cluster.nccl.timeout_minutes=30")
    per_rank = DEEPSEEK_PARAMS * 14 / RANKS  # ~4.67 GB: the fully parallel strategy spreads the save evenly
    assert not c.async_save and c.ranks == RANKS
    assert c.bytes_per_rank == pytest.approx(per_rank, rel=1e-4)
    assert c.staging_s == pytest.approx(per_rank / HOPPER_HOST_COPY, rel=1e-4)  # ~0.19 s
    assert c.write_s == pytest.approx(DEEPSEEK_PARAMS * 14 / 10e9, rel=1e-4)  # ~956 s
    assert c.digest_s == pytest.approx(per_rank / XXH3_128, rel=1e-4)  # ~0.18 s, inside the write
    assert c.persist_s == c.write_s
    assert c.exposed_s == pytest.approx(c.staging_s + c.write_s) and c.overlapped_s == 0
    assert c.timeout_s == 1800 and c.exposed_s < c.timeout_s  # no rank-0 hash of 9.56 TB any more


def test_an_asynchronous_save_stops_training_for_the_staging_copy_only() -> None:
    c = _size(*DEEPSEEK, "train.checkpoint.async_save=true")
    assert c.async_save
    assert c.exposed_s == c.staging_s == pytest.approx(DEEPSEEK_PARAMS * 14 / RANKS / HOPPER_HOST_COPY, rel=1e-4)
    assert c.overlapped_s == c.persist_s == c.write_s
    assert c.exposed_at(interval_s=10_000) == c.staging_s  # the persist ended before the next save
    assert c.exposed_at(interval_s=100) == pytest.approx(c.staging_s + c.write_s - 100)  # it waits for the rest


def test_the_digest_bounds_the_persist_where_it_is_slower_than_the_write() -> None:
    c = _size(*DEEPSEEK, "cluster.storage_write_gb_per_s=100000")  # 100 TB/s: each rank writes 49 GB/s
    assert c.digest_s > c.write_s and c.persist_s == c.digest_s


def test_the_staged_shares_of_a_node_against_its_host_memory() -> None:
    c = _size(*DEEPSEEK)
    assert c.host_bytes_per_node == pytest.approx(DEEPSEEK_PARAMS * 14 / RANKS * 8, rel=1e-4)  # ~37 GB
    assert c.host_memory_bytes == 2048 * 2**30 and c.host_fits  # DGX H800: 2 TB
    unknown = _size(*DEEPSEEK, "hardware.host_memory_gib=null")
    assert unknown.host_memory_bytes is None and unknown.host_fits is None


def test_cpu_ranks_stage_at_half_their_memory_bandwidth() -> None:
    c = _size()  # the built-in spec: hardware=cpu, hardware.gpu.hbm_gb_per_s=20
    assert c.host_copy_bytes_per_s == 10e9
    assert c.staging_s == pytest.approx(c.bytes_per_save / 2 / 10e9)


def _young_daly(cost_s: float, mtbf_s: float) -> float:
    """Daly's first-order optimum interval (2006): sqrt(2 C M) - C."""
    return math.sqrt(2 * cost_s * mtbf_s) - cost_s


def test_young_daly_interval_of_a_synchronous_save() -> None:
    spec = _training(*DEEPSEEK)
    c = checkpoint_size(spec)
    mtbf = LLAMA3_NODE_MTBF_H * 3600 / 256  # 256 nodes: ~24.7 h
    timed = checkpoint_cadence(c, spec, step_s=50.0)
    assert timed.job_mtbf_s == pytest.approx(mtbf, rel=1e-3)
    expected = _young_daly(c.staging_s + c.write_s, mtbf)  # ~13,050 s
    assert timed.advice == "young" and timed.advised_interval_s == pytest.approx(expected, rel=1e-3)
    assert timed.advised_interval_steps in (math.floor(expected / 50), math.ceil(expected / 50))
    interval_s = 500 * 50.0  # train.checkpoint.interval of specs/train/default.yaml
    assert timed.interval_s == interval_s and timed.wait_s == 0
    cycle = interval_s + c.staging_s + c.write_s
    assert timed.lost_share == pytest.approx((c.staging_s + c.write_s) / cycle + cycle / (2 * mtbf), rel=1e-3)


def test_young_daly_interval_of_an_asynchronous_save_is_raised_to_the_persist() -> None:
    spec = _training(*DEEPSEEK, "train.checkpoint.async_save=true")
    c = checkpoint_size(spec)
    mtbf = LLAMA3_NODE_MTBF_H * 3600 / 256
    timed = checkpoint_cadence(c, spec, step_s=50.0)
    assert _young_daly(c.staging_s, mtbf) < c.write_s  # ~182 s, but the persist takes ~956 s
    assert timed.young_interval_s == pytest.approx(_young_daly(c.staging_s, mtbf), rel=1e-3)
    assert timed.advice == "persist" and timed.advised_interval_s == c.write_s
    assert timed.advised_interval_steps == math.ceil(c.write_s / 50)  # 20: 19 steps would wait for the persist
    fast = _training(*DEEPSEEK, "train.checkpoint.async_save=true", "cluster.storage_write_gb_per_s=2000")
    fast_c = checkpoint_size(fast)
    quick = checkpoint_cadence(fast_c, fast, step_s=50.0)  # a 4.8 s persist
    assert quick.advice == "young"
    assert quick.advised_interval_s == pytest.approx(_young_daly(fast_c.staging_s, mtbf), rel=1e-3)


def test_an_asynchronous_save_waits_for_a_persist_longer_than_the_interval() -> None:
    spec = _training(*DEEPSEEK, "train.checkpoint.async_save=true", "train.checkpoint.interval=2")
    c = checkpoint_size(spec)
    timed = checkpoint_cadence(c, spec, step_s=50.0)
    assert timed.wait_s == pytest.approx(c.write_s - 100)
    assert timed.exposed_per_save_s == pytest.approx(c.staging_s + c.write_s - 100)


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
