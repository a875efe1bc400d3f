"""The communication estimate: ring volumes against link bandwidths, and the 30% warning."""

from __future__ import annotations

import pytest
from helpers.specs import spec_of

from lmspec.compiler.models.comm import CommEstimate, dp_bytes_per_param
from lmspec.compiler.models.steptime import estimate_comm_and_step
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
    assert comm.tp_s == pytest.approx(expected_bytes / (spec.hardware.intra_node.gb_per_s * 1e9))


def test_more_tp_over_pcie_costs_more_and_nvlink_less() -> None:
    tp8, tp4 = (_comm(spec_of(*RTX, f"parallel.tp={tp}")) for tp in (8, 4))
    nvlink = _comm(spec_of(*RTX, "parallel.tp=8", "hardware=h100_80g"))
    assert tp8.tp_s > tp4.tp_s > 0 and nvlink.tp_s < tp8.tp_s / 10


def test_seed_tp8_slowdown_is_flagged(lmspec) -> None:
    result = lmspec("check", *RTX, "parallel.tp=8")
    assert result.code == 0
    assert "warning: communication is 87% of compute time (> 30%)" in result.err
    assert "biggest: parallel.tp=8 (command-line override); lower parallel.tp" in result.err


def test_plan_json_carries_the_share_the_doctor_reads(lmspec) -> None:
    import json

    result = lmspec("explain", "--format", "json", *RTX, "parallel.tp=8")
    comm = json.loads(result.out)["comm"]
    assert comm["share_of_step"] == pytest.approx(comm["total_s"] / (comm["total_s"] + comm["compute_s"]), rel=1e-5)
    assert comm["ratio_to_compute"] > 0.3


@pytest.mark.parametrize(
    ("zero_stage", "distributed_optimizer", "grad_bytes", "param_bytes", "once", "every"),
    [
        pytest.param(0, False, 4, 2, 8, 0, id="megatron DDP: all-reduce of fp32 main grads"),
        pytest.param(0, True, 4, 2, 6, 0, id="megatron dist-opt: reduce-scatter fp32 grads + all-gather bf16"),
        pytest.param(0, False, 2, 2, 4, 0, id="ZeRO-0 bf16: all-reduce of bf16 grads"),
        pytest.param(1, False, 2, 2, 4, 0, id="ZeRO-1: reduce-scatter + all-gather at the boundary"),
        pytest.param(2, False, 2, 2, 2, 2, id="ZeRO-2: grads reduce-scattered every micro-batch"),
        pytest.param(3, False, 2, 2, 0, 6, id="ZeRO-3: 2 gathers + reduce-scatter every micro-batch"),
    ],
)
def test_dp_bytes_per_param_are_the_backends_collectives(
    zero_stage: int, distributed_optimizer: bool, grad_bytes: int, param_bytes: int, once: int, every: int
) -> None:
    assert dp_bytes_per_param(zero_stage, distributed_optimizer, grad_bytes, param_bytes) == (once, every)


def test_unsharded_megatron_dp_moves_8_bytes_per_parameter() -> None:
    """One all-reduce of fp32 main gradients: 2 x 4 B x (n-1)/n per parameter, no weights."""
    spec = spec_of("model=llama3_8b", "hardware=h100_80g", "parallel.tp=2", "parallel.distributed_optimizer=false")
    memory = estimate_train_memory(spec)
    assert memory is not None and spec.hardware.nodes == 1  # dp = 8 / 2 = 4 ranks on NVLink
    link_bytes_per_s = spec.hardware.intra_node.gb_per_s * 1e9
    expected = 8 * 3 / 4 * memory.worst.dense_params / link_bytes_per_s
    assert _comm(spec).dp_s == pytest.approx(expected, rel=1e-6)
