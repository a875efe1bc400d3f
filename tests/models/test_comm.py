"""The communication estimate: ring volumes against link bandwidths, and the 30% warning."""

from __future__ import annotations

import pytest
from helpers.specs import spec_of

from lmspec.compiler.models.comm import estimate_comm

RTX = [
    "model=llama3_8b",
    "hardware=rtx4090_24g",
    "hardware.nodes=2",
    "parallel.sequence_parallel=true",
    "parallel.distributed_optimizer=true",
    "train.global_batch_size=64",
]


def test_tp_all_reduce_volume_over_pcie() -> None:
    spec = spec_of(*RTX, "parallel.tp=8")
    comm = estimate_comm(spec)
    assert comm is not None
    t, m = spec.train, spec.model
    micro_batches = t.global_batch_size // (t.micro_batch_size * 2)  # dp = 16 / 8
    per_collective = 2 * 7 / 8 * t.seq_length * t.micro_batch_size * m.hidden_size * 2  # ring all-reduce, bf16
    expected_bytes = micro_batches * m.num_layers * 4 * per_collective  # selective: 2 forward + 2 backward
    assert comm.tp_s == pytest.approx(expected_bytes / (spec.hardware.intra_node.gb_per_s * 1e9))


def test_more_tp_over_pcie_costs_more_and_nvlink_less() -> None:
    tp8, tp4 = (estimate_comm(spec_of(*RTX, f"parallel.tp={tp}")) for tp in (8, 4))
    nvlink = estimate_comm(spec_of(*RTX, "parallel.tp=8", "hardware=h100_80g"))
    assert tp8.tp_s > tp4.tp_s > 0 and nvlink.tp_s < tp8.tp_s / 10


def test_seed_tp8_slowdown_is_flagged(lmspec) -> None:
    result = lmspec("check", *RTX, "parallel.tp=8")
    assert result.code == 0
    assert "warning: communication is 95% of compute time (> 30%)" in result.err
    assert "biggest: parallel.tp=8 (command-line override); lower parallel.tp" in result.err


def test_plan_json_carries_the_share_the_doctor_reads(lmspec) -> None:
    import json

    result = lmspec("explain", "--format", "json", *RTX, "parallel.tp=8")
    comm = json.loads(result.out)["comm"]
    assert comm["share_of_step"] == pytest.approx(comm["total_s"] / (comm["total_s"] + comm["compute_s"]), rel=1e-5)
    assert comm["ratio_to_compute"] > 0.3
