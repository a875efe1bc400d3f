"""REPORT.md a reviewer can sign: the checkpoint section, the one estimated step time, one format per kind of
number, and the save-time warning (compiler/rules/checkpoint.py); numbers asserted from the published
parameter counts and plain arithmetic, not from lmspec's output."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
from helpers.build import compile_build

from lmspec.compiler.models.checkpoint_size import MANIFEST_HASH_BYTES_PER_S
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


def test_deepseek_v3_save_time_at_the_default_bandwidth_and_the_warning(reports) -> None:
    per_save = DEEPSEEK_PARAMS * 14
    write_s, hash_s = per_save / 10e9, per_save / MANIFEST_HASH_BYTES_PER_S  # 10 GB/s: specs/cluster/local.yaml
    rows = _rows(_section(reports[DEEPSEEK], "Checkpoints"))
    assert (
        f"written in {write_s:,.0f} s ({write_s / 60:.1f} min) at cluster.storage_write_gb_per_s=10"
        in (rows["save time"])
    )
    assert "a save outlasts it" in rows["collective timeout"]
    warnings = _section(reports[DEEPSEEK], "Warnings")
    minutes = math.ceil((write_s + hash_s) / 60)
    for fragment in (
        "a checkpoint save holds every rank in a collective for",
        "longer than cluster.nccl.timeout_minutes=30 (lmspec:specs/cluster/local.yaml:",
        "at cluster.storage_write_gb_per_s=10.0 (lmspec:specs/cluster/local.yaml:",
        f"raise cluster.nccl.timeout_minutes to {minutes} or more",
        "an asynchronous save is not offered",
    ):
        assert fragment in warnings, fragment


@pytest.mark.parametrize("spec", PRESETS[1:])
def test_the_smaller_presets_save_inside_the_timeout(reports, spec: str | None) -> None:
    assert "a checkpoint save holds every rank" not in reports[spec]
    assert "a save ends inside it" in _rows(_section(reports[spec], "Checkpoints"))["collective timeout"]


def test_the_warning_names_the_overrides_and_the_bandwidth_that_would_do(lmspec) -> None:
    result = lmspec(
        "check",
        "--spec",
        "llama3_70b_pretrain_64gpu_h100_bf16",
        "cluster.storage_write_gb_per_s=1",
        "cluster.nccl.timeout_minutes=15",
    )
    per_save = LLAMA3_70B_PARAMS * 14
    needed = per_save / (15 * 60 - per_save / MANIFEST_HASH_BYTES_PER_S) / 1e9
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
