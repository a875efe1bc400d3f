"""Golden messages of the launch rules: key, value, origin and the fix, one case per rule."""

from __future__ import annotations

import pytest

from lmspec.compiler.errors import SpecError
from lmspec.compiler.launchers.slurm import time_limit_seconds
from lmspec.compiler.pipeline import make_plan

ERRORS = [
    pytest.param(
        ["cluster=slurm", "cluster.slurm.partition='gpu;rm'"],
        "cluster.slurm.partition",
        ['cluster.slurm.partition="gpu;rm" (command-line override)', "#SBATCH", "plain Slurm name"],
        id="partition-not-plain",
    ),
    pytest.param(
        ["cluster.slurm.account='a b'"],
        "cluster.slurm.account",
        ['cluster.slurm.account="a b" (command-line override)', "plain Slurm name"],
        id="account-not-plain",
    ),
    pytest.param(
        ["cluster.slurm.time=00:05:00", "cluster.slurm.signal_seconds=300"],
        "cluster.slurm.signal_seconds",
        [
            "cluster.slurm.signal_seconds=300",
            'cluster.slurm.time="00:05:00" (command-line override)',
            "(300 s)",
            "below 300, e.g. 30",
        ],
        id="signal-after-limit",
    ),
    pytest.param(
        ["hardware.inter_node.hca=[mlx5_0,'mlx5_1,mlx5_2']"],
        "hardware.inter_node.hca",
        ["'mlx5_1,mlx5_2' is not an RDMA device name", "mlx5_0:1"],
        id="hca-with-comma",
    ),
]
WARNINGS = [
    pytest.param(
        [
            "hardware=h100_80g",
            "hardware.nodes=2",
            "hardware.inter_node.fabric=roce",
            "model=llama3_8b",
            "parallel.distributed_optimizer=true",
            "cluster=slurm",
        ],
        "cluster.nccl.ib_gid_index",
        [
            "cluster.nccl.ib_gid_index=null",
            'hardware.inter_node.fabric="roce" (command-line override)',
            "cluster.nccl.ib_gid_index=3",
        ],
        id="roce-without-gid",
    ),
    pytest.param(
        ["cluster.nccl.ib_gid_index=3"],
        "cluster.nccl.ib_gid_index",
        ['is ignored with hardware.inter_node.fabric="ethernet"', "ib_gid_index=null"],
        id="gid-not-roce",
    ),
    pytest.param(
        ["hardware.nodes=2"],
        "cluster.launcher",
        [
            'cluster.launcher="local" (',
            "specs/cluster/local.yaml:3)",
            "hardware.nodes=2 (command-line override)",
            "NODE_RANK and MASTER_ADDR, or use cluster=slurm",
        ],
        id="local-multi-node",
    ),
]


@pytest.mark.parametrize(("overrides", "key", "expected"), ERRORS)
def test_launch_rule_errors(overrides: list[str], key: str, expected: list[str]) -> None:
    with pytest.raises(SpecError) as caught:
        make_plan(overrides)
    messages = [p.message for p in caught.value.problems if p.key == key and p.severity == "error"]
    assert len(messages) == 1, caught.value
    for text in expected:
        assert text in messages[0]


@pytest.mark.parametrize(("overrides", "key", "expected"), WARNINGS)
def test_launch_rule_warnings(overrides: list[str], key: str, expected: list[str]) -> None:
    plan = make_plan(overrides)
    messages = [w.message for w in plan.warnings if w.key == key]
    assert len(messages) == 1, plan.warnings
    for text in expected:
        assert text in messages[0]


@pytest.mark.parametrize(("limit", "seconds"), [("00:00:59", 59), ("04:00:00", 14400), ("2-03:04:05", 183845)])
def test_time_limit_seconds(limit: str, seconds: int) -> None:
    assert time_limit_seconds(limit) == seconds
