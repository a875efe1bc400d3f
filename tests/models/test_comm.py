"""The communication estimate: ring volumes against NCCL bus bandwidths, and the 30% warning on what overlap
leaves exposed."""

from __future__ import annotations

import pytest
from helpers.specs import spec_of

from lmspec.compiler.models.comm import CommEstimate, DpTraffic, dp_traffic
from lmspec.compiler.models.dims import ParallelDims
from lmspec.compiler.models.steptime import estimate_comm_and_step
from lmspec.compiler.models.steptime_inputs import bus_links
from lmspec.compiler.models.train_memory import estimate_train_memory
from lmspec.compiler.spec.sections import Spec

RTX = [
    "model=llama3_8b",
    "hardware=rtx4090_24g",
    "hardware.nodes=2",
    "parallel.sequence_parallel=true",
    "parallel.distributed_optimizer=true",
    "train.global_batch_size=64",
]


def _comm(spec: Spec) -> CommEstimate:
    memory = estimate_train_memory(spec)
    assert memory is not None
    priced = estimate_comm_and_step(spec, memory)
    assert priced is not None
    return priced[0]


def test_tp_all_reduce_volume_over_pcie() -> None:
    spec = spec_of(*RTX, "parallel.tp=8")
    comm = _comm(spec)
    t, m = spec.train, spec.model
    micro_batches = t.global_batch_size // (t.micro_batch_size * 2)  # dp = 16 / 8
    per_collective = 2 * 7 / 8 * t.seq_length * t.micro_batch_size * m.hidden_size * 2  # ring all-reduce, bf16
    expected_bytes = micro_batches * m.num_layers * 4 * per_collective  # selective: 2 forward + 2 backward
    assert comm.tp_s == pytest.approx(expected_bytes / bus_links(spec.hardware).intra_bytes_per_s)


def test_more_tp_over_pcie_costs_more_and_nvlink_less() -> None:
    tp8, tp4 = (_comm(spec_of(*RTX, f"parallel.tp={tp}")) for tp in (8, 4))
    nvlink = _comm(spec_of(*RTX, "parallel.tp=8", "hardware=h100_80g"))
    assert tp8.tp_s > tp4.tp_s > 0 and nvlink.tp_s < tp8.tp_s / 10


def test_seed_tp8_slowdown_is_flagged(lmspec) -> None:
    result = lmspec("check", *RTX, "parallel.tp=8")
    assert result.code == 0
    assert "warning: communication is " in result.err and "% of compute time (> 30%)" in result.err
    assert "biggest: parallel.tp=8 (command-line override); lower parallel.tp" in result.err


def test_plan_json_carries_the_share_the_doctor_reads(lmspec) -> None:
    import json

    result = lmspec("explain", "--format", "json", *RTX, "parallel.tp=8")
    comm = json.loads(result.out)["comm"]
    assert comm["share_of_step"] == pytest.approx(comm["total_s"] / (comm["total_s"] + comm["compute_s"]), rel=1e-5)
    assert comm["ratio_to_compute"] > 0.3


@pytest.mark.parametrize(
    ("zero_stage", "distributed_optimizer", "grad_bytes", "param_bytes", "traffic"),
    [
        pytest.param(0, False, 4, 2, DpTraffic(8, 0, 0), id="megatron DDP: all-reduce of fp32 main grads"),
        pytest.param(0, True, 4, 2, DpTraffic(4, 2, 0), id="megatron dist-opt: reduce-scatter fp32 + all-gather bf16"),
        pytest.param(0, False, 2, 2, DpTraffic(4, 0, 0), id="ZeRO-0 bf16: all-reduce of bf16 grads"),
        pytest.param(1, False, 2, 2, DpTraffic(2, 2, 0), id="ZeRO-1: reduce-scatter + all-gather at the boundary"),
        pytest.param(2, False, 2, 2, DpTraffic(0, 2, 2), id="ZeRO-2: grads reduce-scattered every micro-batch"),
        pytest.param(3, False, 2, 2, DpTraffic(0, 0, 6), id="ZeRO-3: 2 gathers + reduce-scatter every micro-batch"),
    ],
)
def test_dp_traffic_is_the_backends_collectives(
    zero_stage: int, distributed_optimizer: bool, grad_bytes: int, param_bytes: int, traffic: DpTraffic
) -> None:
    assert dp_traffic(zero_stage, distributed_optimizer, grad_bytes, param_bytes) == traffic


@pytest.mark.parametrize(
    ("zero_stage", "traffic"),
    [
        pytest.param(0, DpTraffic(0, 0, 8), id="replicated: fp32 gradients all-reduced every micro-batch"),
        pytest.param(2, DpTraffic(0, 0, 6), id="SHARD_GRAD_OP: a gather and a reduce-scatter every micro-batch"),
        pytest.param(3, DpTraffic(0, 0, 8), id="FULL_SHARD: 2 gathers and a reduce-scatter every micro-batch"),
    ],
)
def test_fsdp2_syncs_every_micro_batch(zero_stage: int, traffic: DpTraffic) -> None:
    """torchtitan's FSDP2 (TrainingBackend.fsdp): fp32 gradients, bf16 weights."""
    assert dp_traffic(zero_stage, False, 4, 2, every_micro_batch=1) == traffic


def test_unsharded_megatron_dp_moves_8_bytes_per_parameter() -> None:
    """One all-reduce of fp32 main gradients: 2 x 4 B x (n-1)/n per parameter, no weights."""
    spec = spec_of("model=llama3_8b", "hardware=h100_80g", "parallel.tp=2", "parallel.distributed_optimizer=false")
    memory = estimate_train_memory(spec)
    assert memory is not None and spec.hardware.nodes == 1  # dp = 8 / 2 = 4 ranks on NVLink
    link_bytes_per_s = bus_links(spec.hardware).intra_bytes_per_s
    expected = 8 * 3 / 4 * memory.worst.dense_params / link_bytes_per_s
    assert _comm(spec).dp_s == pytest.approx(expected, rel=1e-6)


def test_a_ring_across_nodes_drives_the_nics_of_its_members_in_each_node() -> None:
    """NCCL runs a ring per NIC and each ring leaves a node once: a data-parallel group with all 8 GPUs of
    each node (tp 1) moves 8 GPUs' share of the NICs, one GPU per node (tp 8) its own share, and neither
    outruns NVLink."""
    base = ["model=llama3_70b", "hardware=h100_80g", "hardware.nodes=4", "parallel.distributed_optimizer=true"]
    spec = spec_of(*base, "parallel.tp=8")
    links = bus_links(spec.hardware)
    wide = ParallelDims.from_spec(spec_of(*base, "parallel.tp=1"))
    narrow = ParallelDims.from_spec(spec)
    assert wide is not None and narrow is not None
    assert links.ring_bytes_per_s(narrow, narrow.dense_dp_span, narrow.tp) == links.inter_bytes_per_s
    assert links.ring_bytes_per_s(wide, wide.dense_dp_span, wide.tp) == min(
        8 * links.inter_bytes_per_s, links.intra_bytes_per_s
    )
