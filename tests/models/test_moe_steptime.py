"""MoE in the step-time model (issue 39): each dispatcher's volumes and links, the EP rank imbalance, the
overlaps megatron-core schedules, and launch-bound expert layers, checked as mechanisms on their own and
through composed specs (the calibration's accuracy is tests/models/test_steptime_calibration.py's)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lmspec.compiler.models.moe_dispatch import dispatch_bytes, distinct
from lmspec.compiler.models.moe_load import Routing, rank_imbalance, sampling_imbalance
from lmspec.compiler.models.steptime import StepTime, step_time
from lmspec.compiler.models.steptime_inputs import step_constants, step_inputs
from lmspec.compiler.models.train_memory import moe_loads
from lmspec.compiler.pipeline import derive_despite_rules

TOKENS, HIDDEN, BYTES = 4096, 7168, 2
DEEPSEEK = ["model=deepseek_v3", "hardware=h800_80g", "hardware.nodes=256", "parallel.pp=16", "parallel.pp_layout=auto"]
DEEPSEEK += ["parallel.ep=64", "parallel.distributed_optimizer=true", "train.recompute=full", "serve=null"]


def _step(*overrides: str) -> StepTime:
    train = derive_despite_rules(list(overrides)).plan.train
    inputs = step_inputs(train.spec, train.memory)
    assert inputs is not None
    return step_time(inputs, step_constants(train.spec))


def test_alltoall_inside_a_node_stays_on_nvlink_and_across_nodes_splits_by_peer() -> None:
    inside = dispatch_bytes("alltoall", 8, 8, TOKENS, 8, HIDDEN, BYTES)
    assert inside.inter == 0
    assert inside.intra == pytest.approx(4 * 8 * 7 / 8 * TOKENS * HIDDEN * BYTES)
    across = dispatch_bytes("alltoall", 64, 8, TOKENS, 8, HIDDEN, BYTES)
    assert across.intra / across.inter == pytest.approx(7 / 56)  # 7 peers in the node, 56 beyond it


def test_allgather_moves_every_token_of_the_group_whatever_top_k() -> None:
    few, many = (dispatch_bytes("allgather", 8, 8, TOKENS, k, HIDDEN, BYTES) for k in (1, 8))
    assert few == many
    assert dispatch_bytes("allgather", 4, 8, TOKENS, 2, HIDDEN, BYTES).intra < few.intra  # grows with ep
    assert (
        dispatch_bytes("allgather", 2, 8, TOKENS, 8, HIDDEN, BYTES).intra
        < dispatch_bytes("alltoall", 2, 8, TOKENS, 8, HIDDEN, BYTES).intra
    )  # the small-EP choice: 1 copy to the one peer instead of 8 x 1/2


def test_flex_crosses_the_network_once_per_node_and_node_limited_routing_bounds_it() -> None:
    alltoall = dispatch_bytes("alltoall", 64, 8, TOKENS, 8, HIDDEN, BYTES)
    flex = dispatch_bytes("flex", 64, 8, TOKENS, 8, HIDDEN, BYTES)
    limited = dispatch_bytes("flex", 64, 8, TOKENS, 8, HIDDEN, BYTES, route_groups=8, route_group_topk=4)
    token = TOKENS * HIDDEN * BYTES
    assert flex.inter == pytest.approx(4 * distinct(8, 8) * 7 / 8 * token)
    assert limited.inter == pytest.approx(4 * distinct(4, 8) * 7 / 8 * token)
    assert limited.inter < flex.inter < alltoall.inter
    assert distinct(4, 8) <= 4  # DeepSeek-V3: a token reaches at most 4 nodes


def test_distinct_places() -> None:
    assert distinct(1, 8) == 1
    assert distinct(8, 1) == pytest.approx(1)
    assert distinct(1e9, 8) == pytest.approx(8, rel=1e-6)


def test_imbalance_from_the_routing_settings() -> None:
    assert rank_imbalance(1, TOKENS, 8) == 1.0
    assert rank_imbalance(64, TOKENS, 8, Routing(force_balance=True)) == 1.0
    assert rank_imbalance(64, TOKENS, 8, Routing(stated=1.3)) == 1.3
    sampled = rank_imbalance(64, TOKENS, 8)
    assert sampled == pytest.approx(1 + math.sqrt(2 * math.log(64) * (1 - 1 / 64) / (TOKENS * 8)))
    assert rank_imbalance(64, 16, 8) > sampled  # fewer tokens, wider spread
    assert rank_imbalance(64, TOKENS, 8, Routing(stated=1.5, capacity_factor=1.25)) == 1.25  # drops above capacity
    assert rank_imbalance(64, TOKENS, 8, Routing(capacity_factor=1.25, pad_to_capacity=True)) == 1.25
    arrays = rank_imbalance(np.array([1, 8, 64]), np.array([TOKENS] * 3), 8)
    assert arrays[0] == 1.0 and arrays[1] == pytest.approx(sampling_imbalance(8, TOKENS * 8))


def test_the_spec_path_reads_train_moe() -> None:
    train = derive_despite_rules([*DEEPSEEK, "train.moe.load_imbalance=1.2"]).plan.train
    assert step_constants(train.spec).routing == Routing(stated=1.2)
    assert moe_loads(train.spec, 64, TOKENS) == (1.2, 1.0)  # the memory model's worst EP rank
    dense = derive_despite_rules(["model=llama3_8b", "hardware=h100_80g"]).plan.train
    assert moe_loads(dense.spec, 1, TOKENS) == (1.0, 1.0)


def test_deepeps_dispatch_is_cheaper_than_the_alltoall_across_nodes() -> None:
    alltoall, flex = _step(*DEEPSEEK), _step(*DEEPSEEK, "train.moe.dispatcher=flex", "train.moe.flex_backend=deepep")
    assert flex.ep_raw < alltoall.ep_raw / 2
    assert flex.compute == pytest.approx(alltoall.compute)


def test_a_stated_imbalance_slows_the_experts_and_their_all_to_alls() -> None:
    balanced, skewed = (
        _step(*DEEPSEEK, "train.moe.force_balance=true"),
        _step(*DEEPSEEK, "train.moe.load_imbalance=1.3"),
    )
    assert skewed.ep_raw == pytest.approx(1.3 * balanced.ep_raw)
    assert skewed.compute > balanced.compute


def test_overlaps_hide_the_all_to_alls_but_not_the_sms_they_hold() -> None:
    """moe_a2a hides them behind another micro-batch's compute, shared_expert_overlap behind the shared
    experts' GEMMs (less compute to hide behind); hidden, they still hold 20 of 132 SMs."""
    plain = _step(*DEEPSEEK, "train.recompute=selective", "train.global_batch_size=15360")
    shared = _step(*DEEPSEEK, "train.recompute=selective", "train.moe.shared_expert_overlap=true")
    hidden = _step(*DEEPSEEK, "train.recompute=selective", "parallel.virtual_stages=2", "parallel.overlap.moe_a2a=true")
    assert plain.ep_comm == pytest.approx(plain.ep_raw)
    assert hidden.ep_comm < shared.ep_comm < plain.ep_comm
    args = [*DEEPSEEK, "train.recompute=selective", "parallel.virtual_stages=2", "parallel.overlap.moe_a2a=true"]
    m = derive_despite_rules(args).plan.train.batch.grad_accum_steps
    assert m > 1
    # the step's unpaired 1/m exposed, the rest inside the window at the SMs' cost
    assert hidden.ep_comm == pytest.approx(hidden.ep_raw * (1 / m + (1 - 1 / m) * 20 / 132), rel=0.05)


def test_fine_grained_experts_are_launch_bound_and_large_ones_are_not() -> None:
    """Qwen3-30B-A3B's 128 small experts: at EP1 every one is launched on each GPU, so its MoE layers wait
    on the host; spread over EP8 they are 16 per GPU. Mixtral's 8 large experts never wait on it."""
    qwen = ["model=qwen3_30b_a3b", "hardware=h100_80g", "hardware.nodes=2", "parallel.pp=2", "serve=null"]
    one, eight = _step(*qwen), _step(*qwen, "parallel.ep=8")
    assert one.compute / eight.compute > 2  # far more than the 1.0 of GPU work that did not change
    mixtral = ["model=mixtral_8x7b", "hardware=h100_80g", "hardware.nodes=8", "parallel.pp=4", "serve=null"]
    # EP1 still runs each expert's GEMM on a quarter of EP8's rows: a few percent, not the host's 2x
    assert _step(*mixtral).compute == pytest.approx(_step(*mixtral, "parallel.ep=8").compute, rel=0.05)


def test_experts_split_by_expert_tensor_parallelism_gather_their_copies() -> None:
    """ETP2 adds an all-gather and a reduce-scatter of the received copies to every MoE layer's traffic."""
    mixtral = ["model=mixtral_8x7b", "hardware=h100_80g", "hardware.nodes=8", "parallel.pp=4", "serve=null"]
    mixtral += ["parallel.tp=2", "parallel.sequence_parallel=true", "parallel.ep=4"]
    whole, split = _step(*mixtral), _step(*mixtral, "parallel.etp=2")
    assert split.ep_raw > whole.ep_raw
    assert dispatch_bytes("alltoall", 4, 4, TOKENS, 2, HIDDEN, BYTES).inter == 0


def test_one_micro_batch_leaves_nothing_to_pair_its_all_to_alls_with() -> None:
    """The combined 1F1B hides one micro-batch's all-to-alls behind another's compute: with one micro-batch
    per step (MLPerf's GPT-OSS 20B: batch 64 on 64 DP ranks) they stay exposed; with many, 1/m of them."""
    job = ["model=qwen3_30b_a3b", "hardware=h100_80g", "hardware.nodes=2", "parallel.ep=16", "serve=null"]
    job += ["train.recompute=selective", "parallel.overlap.moe_a2a=true", "train.micro_batch_size=1"]
    one = _step(*job, "train.global_batch_size=16")
    assert one.ep_comm == pytest.approx(one.ep_raw)
    many = _step(*job, "train.global_batch_size=256")  # 16 micro-batches
    assert many.ep_comm < many.ep_raw / 4
