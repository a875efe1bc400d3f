"""Golden errors of the memory budget: the key, the numbers and the fix appear, no traceback."""

from __future__ import annotations

import json

import pytest

SEED_671B = ["model=deepseek_v3", "hardware=a100_80g", "hardware.nodes=4", "parallel.tp=8", "parallel.zero_stage=3"]
DEEPSEEK_2048 = [
    "model=deepseek_v3",
    "hardware=h800_80g",
    "hardware.nodes=256",
    "parallel.tp=1",
    "parallel.pp=16",
    "parallel.ep=64",
    "parallel.pp_layout=auto",
    "parallel.distributed_optimizer=true",
    "train.seq_length=4096",
    "train.micro_batch_size=1",
    "serve.pp=3",
    "serve.host=0.0.0.0",  # the engine spans 3 nodes
]

CASES = [
    pytest.param(
        SEED_671B + ["train.backend=deepspeed"],
        [
            "hardware.gpu.memory_gib=80.0",
            # the optimizer step's peak (DeepSpeed's fp32 gradient partition and Adam's temporaries) is over
            # the backward's: recompute, which lowers the backward's, is no fix
            "needs 648.7 GiB (696.5 GB)",
            "leaves 79.0 GiB usable",
            "biggest term: optimizer 238.7 GiB",
            "Fixes, cheapest first: parallel.offload_optimizer=true -> 398.1 GiB",
            "host memory per node",
            "all of these together -> 356.3 GiB",
        ],
        id="seed-671b-32xa100-zero3-deepspeed",
    ),
    pytest.param(
        SEED_671B + ["train.backend=megatron", "parallel.zero_stage=0"],
        [
            "needs 11,803.3 GiB (12,673.7 GB)",
            "biggest term: optimizer 7,459.5 GiB",
            "parallel.distributed_optimizer=true -> 4,221.5 GiB (still over)",
            "parallel.ep=32 -> ",
            "hardware.nodes=32 parallel.dp=auto parallel.ep=64 (256 GPUs) on top of all the above",
        ],
        id="seed-671b-32xa100-tp8-megatron",
    ),
    pytest.param(
        DEEPSEEK_2048 + ["train.seq_length=6144"],  # at 4096 tokens selective recompute fits (75.4 GiB)
        [
            "pipeline stage 1 of 16, 4 layers",
            "needs 106.1 GiB (113.9 GB)",
            "biggest term: activations",
            "8 micro-batch(es) in flight",
            'train.recompute="selective"',
            "Fixes, cheapest first: train.recompute=full -> 31.1 GiB (fits)",
        ],
        id="deepseek-2048xh800-selective",
    ),
    pytest.param(
        DEEPSEEK_2048 + ["train.recompute=none", "train.flash_attention=false"],
        [
            "biggest term: activations",
            # unfused attention's softmax backward holds score-sized gradients of the rebuilt attention
            "train.recompute=selective -> 81.9 GiB (still over)",
            "train.recompute=full -> 31.1 GiB (fits)",
        ],
        id="deepseek-2048xh800-no-recompute-eager",
    ),
    pytest.param(
        ["model=llama3_8b", "hardware=h100_80g", "parallel.tp=2"],
        [
            "needs 82.8 GiB (88.9 GB)",
            "biggest term: optimizer 44.9 GiB",
            "train.recompute=full -> 73.2 GiB (fits)",
            "parallel.distributed_optimizer=true -> 47.5 GiB (fits)",
        ],
        id="llama3-8b-tp2-without-distributed-optimizer",
    ),
    pytest.param(
        ["model=tiny", "hardware.gpu.memory_gib=1.1", "train.micro_batch_size=16", "train.global_batch_size=32"],
        ["leaves 0.1 GiB usable", "train.micro_batch_size=1 -> 0.1 GiB (fits)"],
        id="tiny-on-a-small-device",
    ),
    pytest.param(
        DEEPSEEK_2048[:-2] + ["train.recompute=full"],  # serving on one node
        [
            "serve.max_model_len=4096",
            "minus weights 157.9 GiB (169.6 GB) per GPU",
            "serve.pp=1",
            "no sequence fits",
            "Fixes: serve.pp=3 -> 683,296 tokens (fits)",
        ],
        id="deepseek-serve-one-node",
    ),
    pytest.param(
        [
            "model=llama3_70b",
            "hardware=h100_80g",
            "hardware.nodes=8",
            "parallel.tp=8",
            "parallel.pp=2",
            "parallel.sequence_parallel=true",
            "parallel.distributed_optimizer=true",
            "serve.tp=4",
            "serve.max_model_len=8192",
            "serve.gpu_memory_utilization=0.47",
        ],
        [
            "serve.max_model_len=8192 (command-line override)",
            "(81,920 bytes/token)",
            "leaves 0.5 GiB",
            "the longest that fits is serve.max_model_len=6736",
            "serve.kv_cache_dtype=fp8 -> 13,472 tokens (fits)",
        ],
        id="llama3-70b-serve-kv-too-small",
    ),
]


@pytest.mark.parametrize(("overrides", "expected"), CASES)
def test_budget_error(lmspec, overrides: list[str], expected: list[str]) -> None:
    result = lmspec("check", *overrides)
    result.assert_reports(1, expected)


def test_fixes_that_do_not_help_are_not_offered(lmspec) -> None:
    """With flash attention, selective recompute stores what no recompute stores: not a fix."""
    result = lmspec("check", *DEEPSEEK_2048, "train.recompute=none", "parallel.pp=8", "hardware.nodes=128")
    assert result.code == 1
    assert "Fixes, cheapest first: train.recompute=full -> 41.1 GiB (fits)" in result.err
    assert "train.recompute=selective" not in result.err


def test_deepseek_2048_gpus_fit_with_the_recommended_recompute(lmspec) -> None:
    """DeepSeek's own layout, under the recompute the fix list recommends: accepted, with its breakdown."""
    result = lmspec("explain", "--format", "json", *DEEPSEEK_2048, "train.recompute=full")
    assert result.code == 0, result.err
    memory = json.loads(result.out)["memory"]
    assert memory["fits"] is True and memory["budget_bytes"] == 79 * 2**30
    worst = memory["stages"][memory["worst_stage"]]
    assert worst["total_bytes"] == memory["total_bytes"] < memory["budget_bytes"]
    assert set(memory["per_gpu"]) == {
        "weights_bytes",
        "gradients_bytes",
        "optimizer_bytes",
        "activations_bytes",
        "workspace_bytes",
        "allocator_bytes",
    }
    assert len(memory["stages"]) == 16 and memory["stages"][0]["in_flight_micro_batches"] == 8  # grad accum 8


def test_default_cpu_spec_fits(lmspec, tmp_path) -> None:
    result = lmspec("compile", "-o", str(tmp_path))
    assert result.code == 0, result.err
    plan = json.loads((tmp_path / "tiny" / "plan.json").read_text())
    assert plan["memory"]["fits"] and plan["serve"]["max_concurrent_seqs"] >= 1
    chart = (tmp_path / "tiny" / "report" / "memory.svg").read_text()
    assert chart.startswith("<?xml") and "<dc:date>" not in chart and "weights" in chart
    assert "report/memory.svg" in (tmp_path / "tiny" / "REPORT.md").read_text()
