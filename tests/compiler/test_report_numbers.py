"""REPORT.md a reviewer can sign: the checkpoint section (the save's exposed time apart from its overlapped
persist, the host memory it stages in, the Young/Daly interval), the one estimated step time, one format per
kind of number, and the checkpoint warnings (compiler/rules/checkpoint.py); numbers asserted from the
published parameter counts and plain arithmetic, not from lmspec's output."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
from helpers.build import compile_build

from lmspec.compiler.models.steptime import estimate_step_time

DEEPSEEK = "deepseek_v3_pretrain_2048gpu_h800_bf16"
PRESETS = [
    DEEPSEEK,
    "llama3_70b_pretrain_64gpu_h100_bf16",
    "mixtral_8x7b_pretrain_64gpu_h100_bf16",
    "tiny_deepspeed_zero3_2rank_cpu_fp32",
    None,  # the built-in tiny spec
]
DEEPSEEK_PARAMS = 671.03e9 + 11.61e9  # the model and its MTP module, saved with it
LLAMA3_70B_PARAMS = 70_553_706_496  # Meta-Llama-3-70B as its model card counts it
HOPPER_HOST_COPY = 25e9  # one GPU's share to host memory, every GPU of the node copying (PCIe Gen5 x16 / 2)
JOB_MTBF_S = 6335 * 3600 / 256  # cluster.node_mtbf_hours (Llama 3's) over DeepSeek-V3's 256 nodes


def _section(report: str, heading: str) -> str:
    start = report.index(f"## {heading}")
    end = report.find("\n## ", start + 1)
    return report[start : end if end > 0 else None]


def _rows(section: str) -> dict[str, str]:
    cells = (line.split(" | ", 1) for line in section.splitlines() if line.startswith("| ") and " | " in line)
    return {label[2:]: value.rsplit(" |", 1)[0] for label, value in cells}


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str | None, str]:
    root = tmp_path_factory.mktemp("reports")
    return {spec: (compile_build(root, (), spec).dir / "REPORT.md").read_text() for spec in PRESETS}


def test_deepseek_v3_checkpoint_is_about_9_6_tb_per_save_and_keep_last_k_of_them(reports) -> None:
    rows = _rows(_section(reports[DEEPSEEK], "Checkpoints"))
    per_save = DEEPSEEK_PARAMS * 14  # bf16 weights 2 + fp32 master 4 + Adam moments 8
    assert rows["bytes per parameter"] == (
        "14 = 2 B bf16 weights + 4 B fp32 master weights + 8 B fp32 optimizer moments (2 per parameter)"
    )
    assert rows["per save"] == f"{per_save / 1e12:.2f} TB ({per_save / 2**40:.2f} TiB)" == "9.56 TB (8.69 TiB)"
    kept = rows["kept (train.checkpoint.keep_last_k=3)"]  # specs/train/default.yaml keeps 3
    assert (
        kept.startswith(f"{3 * per_save / 1e12:.2f} TB")
        and f"; {4 * per_save / 1e12:.2f} TB (" in kept
        and kept.endswith("while the next save is written")
    )
    assert "(with the MTP module)" in rows["parameters saved"]


def test_deepseek_v3_saves_asynchronously_exposing_seconds_and_persisting_in_the_background(reports) -> None:
    per_save = DEEPSEEK_PARAMS * 14
    staging_s, write_s = per_save / 2048 / HOPPER_HOST_COPY, per_save / 10e9  # 10 GB/s: specs/cluster/local.yaml
    rows = _rows(_section(reports[DEEPSEEK], "Checkpoints"))
    assert rows["save, exposed (training stops)"].startswith(
        f"**{staging_s:.3g} s** (train.checkpoint.async_save=true): each of 2,048 ranks copies its share, 4.67 GB"
    )
    assert rows["save, persisted in the background"].startswith(
        f"{write_s:,.0f} s ({write_s / 60:.1f} min): written at cluster.storage_write_gb_per_s=10"
    )
    assert rows["staged in host memory"].startswith(f"{per_save / 2048 * 8 / 1e9:.2f} GB")
    assert "of hardware.host_memory_gib=2048" in rows["staged in host memory"]
    assert "a save's exposed time ends inside it" in rows["collective timeout"]
    assert "checkpoint" not in _section(reports[DEEPSEEK], "Warnings")


def test_deepseek_v3_interval_against_young_daly(reports, tmp_path: Path) -> None:
    plan, _ = compile_build(tmp_path, (), DEEPSEEK)
    train = plan.trained()
    step = estimate_step_time(train.spec, train.memory)
    assert step is not None
    per_save = DEEPSEEK_PARAMS * 14
    staging_s, write_s = per_save / 2048 / HOPPER_HOST_COPY, per_save / 10e9
    young = math.sqrt(2 * staging_s * JOB_MTBF_S) - staging_s  # ~182 s: shorter than the persist, so raised to it
    assert young < write_s
    rows = _rows(_section(reports[DEEPSEEK], "Checkpoints"))
    interval_s = 20 * step.total  # the spec's train.checkpoint.interval
    cycle = interval_s + staging_s  # Daly: a save's exposed time per cycle, half a cycle redone per interruption
    lost = staging_s / cycle + cycle / (2 * JOB_MTBF_S)
    assert rows["interval (train.checkpoint.interval=20)"].startswith(
        f"{interval_s:,.0f} s ({interval_s / 60:.1f} min) at the estimated step time; loses {lost:.1%} of the run"
    )
    advised = rows["advised interval (Young/Daly)"]
    assert advised.startswith(f"{math.ceil(write_s / step.total)} steps: loses ")
    assert f"= {young:,.0f} s ({young / 60:.1f} min), raised to the persist, {write_s:,.0f} s" in advised


def test_a_synchronous_save_past_the_timeout_warns_with_async_among_the_fixes(lmspec) -> None:
    result = lmspec(
        "check",
        "--spec",
        DEEPSEEK,
        "train.checkpoint.async_save=false",
        "cluster.storage_write_gb_per_s=4",
    )
    per_save = DEEPSEEK_PARAMS * 14
    staging_s, write_s = per_save / 2048 / HOPPER_HOST_COPY, per_save / 4e9  # ~2,389 s: past 30 min
    result.assert_reports(
        0,
        [
            f"a checkpoint save stops training in a collective for {staging_s + write_s:,.0f} s",
            "longer than cluster.nccl.timeout_minutes=30 (lmspec:specs/cluster/local.yaml:",
            "at cluster.storage_write_gb_per_s=4.0 (command-line override)",
            f"raise cluster.nccl.timeout_minutes to {math.ceil((staging_s + write_s) / 60)} or more",
            "set train.checkpoint.async_save=true (train.backend=megatron)",
        ],
    )
    assert "an asynchronous save is not offered" not in result.err


def test_an_asynchronous_save_warns_only_for_its_exposed_time(lmspec) -> None:
    quiet = lmspec("check", "--spec", DEEPSEEK, "cluster.storage_write_gb_per_s=4")
    assert quiet.code == 0 and "a checkpoint save stops training" not in quiet.err
    waiting = lmspec("check", "--spec", DEEPSEEK, "cluster.storage_write_gb_per_s=4", "train.checkpoint.interval=2")
    waiting.assert_reports(
        0,
        [
            "a checkpoint save stops training in a collective for",
            "persist runs in the background, but it outlasts train.checkpoint.interval=2 (command-line override)",
            "raise train.checkpoint.interval",
        ],
    )


def test_an_interval_far_from_young_daly_warns(lmspec) -> None:
    result = lmspec("check", "--spec", DEEPSEEK, "train.checkpoint.interval=500")
    result.assert_reports(
        0,
        [
            "train.checkpoint.interval=500 (command-line override) loses",
            "cluster.node_mtbf_hours=6335.0 (lmspec:specs/cluster/local.yaml:",
            "hardware.nodes=256",
            "set train.checkpoint.interval=19",  # the persist, 956 s, in whole steps of ~50.8 s
        ],
    )


@pytest.mark.parametrize("spec", PRESETS[1:])
def test_the_smaller_presets_save_inside_the_timeout(reports, spec: str | None) -> None:
    assert "a checkpoint save stops training" not in reports[spec]
    rows = _rows(_section(reports[spec], "Checkpoints"))
    assert "a save's exposed time ends inside it" in rows["collective timeout"]
    assert "(train.checkpoint.async_save=false): each of" in rows["save, exposed (training stops)"]


def test_the_warning_names_the_overrides_and_the_bandwidth_that_would_do(lmspec) -> None:
    result = lmspec(
        "check",
        "--spec",
        "llama3_70b_pretrain_64gpu_h100_bf16",
        "cluster.storage_write_gb_per_s=1",
        "cluster.nccl.timeout_minutes=15",
    )
    per_save = LLAMA3_70B_PARAMS * 14
    needed = per_save / (15 * 60 - per_save / 64 / HOPPER_HOST_COPY) / 1e9  # the write in what staging leaves
    result.assert_reports(
        0,
        [
            "cluster.nccl.timeout_minutes=15 (command-line override)",
            "cluster.storage_write_gb_per_s=1.0 (command-line override)",
            f"writes {per_save / 1e9:,.1f} GB",
            f"storage that writes {needed:.1f} GB/s or more",
        ],
    )


def test_one_estimated_step_time_with_its_throughput_and_the_100_percent_floor(reports) -> None:
    flops = _rows(_section(reports[DEEPSEEK], "FLOPs and step time"))
    assert "at 50% MFU" not in flops and "at 40% MFU" not in flops
    assert flops["step time at 100% MFU (the floor)"].startswith("8.08 s (2,048 x 989 TFLOP/s)")
    estimated = flops["**estimated step time**"]
    assert re.fullmatch(
        r"\*\*[\d.]+ s\*\*: [\d,]+ tokens/s, [\d,]+ tokens/s per GPU, MFU \d+\.\d% \(HFU \d+\.\d%\), "
        r"[\d,]+\.\d\d days per 1T tokens",
        estimated,
    ), estimated
    assert flops["estimated step time, by term"].startswith("compute ")


def test_the_estimate_is_the_step_time_lmspec_plan_and_explain_use(tmp_path: Path) -> None:
    plan, build = compile_build(tmp_path, (), DEEPSEEK)
    train = plan.trained()
    step = estimate_step_time(train.spec, train.memory)
    assert step is not None and train.step_time == step
    tokens_per_s = 15_360 * 4_096 / step.total  # global batch x sequence length per step
    mfu = tokens_per_s * train.flops.per_token / (2048 * 989e12)
    row = _rows(_section((build / "REPORT.md").read_text(), "FLOPs and step time"))["**estimated step time**"]
    assert f"{tokens_per_s:,.0f} tokens/s, {tokens_per_s / 2048:,.0f} tokens/s per GPU, MFU {mfu:.1%}" in row


@pytest.mark.parametrize("spec", PRESETS)
def test_one_format_per_kind_of_number(reports, spec: str | None) -> None:
    report = reports[spec]
    memory = _section(report, "Training memory per GPU")
    figures = [
        cell.strip("* ") for line in memory.splitlines() if line.startswith("| ") for cell in line.split("|")[2:4]
    ]
    figures = [f for f in figures if f and f[0].isdigit()]
    assert len(figures) >= 12 and all(re.fullmatch(r"\d{1,3}(,\d{3})*\.\d\d", f) for f in figures), figures
    batch = _rows(_section(report, "Batch"))
    assert re.fullmatch(r"[\d,]+ x [\d,]+ x [\d,]+ = [\d,]+ sequences", batch["micro batch x grad accum x dp"])
    for value in batch.values():
        assert not re.search(r"\d{4}", value), value  # thousands separated
    flops = _rows(_section(report, "FLOPs and step time"))
    assert re.fullmatch(r"\d\.\d\de\+\d\d", flops["model FLOPs per token"])
    sizes = re.findall(r"\d+\.\d+ (?:GiB|GB|MiB|MB|TiB|TB)\b", report)
    assert sizes and all(re.fullmatch(r"\d+\.\d\d \w+", size) for size in sizes), sizes  # never 0.9778 GiB


def test_cpu_presets_show_memory_in_mib(reports) -> None:
    memory = _section(reports[None], "Training memory per GPU")
    assert "| term | MiB | MB |" in memory
    assert "| usable (device minus reserve) | 7,168.00 | 7,516.19 |" in memory  # 8 GiB minus the 1 GiB reserve
    assert "| term | GiB | GB |" in _section(reports[DEEPSEEK], "Training memory per GPU")
