"""`lmspec logs`: tokens/s, MFU/HFU from lmspec.compiler.models.flops, warm-up, verdicts, plots."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
from helpers.logs_report import LLAMA_FLAGS, logs_report
from helpers.paths import LOG_DATA

from lmspec.compiler.models.flops import hardware_flops_per_token, mfu, model_flops_per_token
from lmspec.compiler.observe.logs.context import load_flags
from lmspec.compiler.observe.logs.parse import parse_log


def test_megatron_mfu_from_flops_model(lmspec) -> None:
    report = logs_report(lmspec, str(LOG_DATA / "healthy_megatron.log"), *LLAMA_FLAGS)
    context = load_flags("llama3_8b", "h100_80g", 64, 4096, ["parallel.distributed_optimizer=true"])
    spec = context.spec
    assert (context.n_gpus, spec.train.global_batch_size, spec.hardware.gpu.bf16_tflops) == (64, 1024, 989)
    steady = [s for s in parse_log(LOG_DATA / "healthy_megatron.log").steps if s.step > 10]
    tokens = [s.global_batch_size * 4096 / s.step_time_s for s in steady]
    # the typed Plan's numbers (the FLOPs model's, through the Plan), never derived again
    per_token, hw_per_token = context.plan.trained().flops.per_token, context.plan.trained().flops.hardware_per_token
    assert per_token == model_flops_per_token(spec.model, 4096)
    assert hw_per_token == hardware_flops_per_token(spec.model, 4096, spec.train.recompute)
    assert report["steps_used"] == len(steady) and report["flops_per_token"] == per_token
    assert report["hardware_flops_per_token"] == hw_per_token
    assert report["metrics"]["tokens_per_s"]["mean"] == pytest.approx(statistics.fmean(tokens))
    assert report["metrics"]["tokens_per_s"]["p50"] == pytest.approx(statistics.median(tokens))
    mfus = [mfu(t, per_token, 64, 989) for t in tokens]
    assert report["metrics"]["mfu"]["mean"] == pytest.approx(statistics.fmean(mfus))
    assert report["metrics"]["hfu"]["mean"] == pytest.approx(
        statistics.fmean(mfu(t, hw_per_token, 64, 989) for t in tokens)
    )
    assert report["metrics"]["tokens_per_s_per_gpu"]["mean"] == pytest.approx(statistics.fmean(tokens) / 64)
    assert 0.40 <= report["metrics"]["mfu"]["mean"] <= 0.60 and "healthy" in report["verdict"]
    assert report["peak_memory_bytes"] == parse_log(LOG_DATA / "healthy_megatron.log").peak_memory_bytes


def test_text_report_and_comm_bound_verdict(lmspec) -> None:
    """The same log on 4x the GPUs (same step times) is a 4x lower MFU: the seed's < 20% verdict."""
    result = lmspec(
        "logs",
        str(LOG_DATA / "healthy_megatron.log"),
        "--model",
        "llama3_8b",
        "--hardware",
        "h100_80g",
        "--gpus",
        "256",
        "--seq-length",
        "4096",
        "--set",
        "parallel.distributed_optimizer=true",
    )
    assert result.code == 0, result.err
    assert "communication or data bound" in result.out
    assert "MFU" in result.out and "tokens/s/GPU" in result.out and "peak memory: 59.77 GiB of 80 GiB" in result.out


def test_deepspeed_tokens_from_samples_and_seq_length(lmspec) -> None:
    report = logs_report(
        lmspec,
        str(LOG_DATA / "healthy_deepspeed.log"),
        "--model",
        "llama3_8b",
        "--hardware",
        "h100_80g",
        "--gpus",
        "8",
        "--seq-length",
        "2048",
        "--set",
        "train.global_batch_size=64",
        "--set",
        "train.backend=deepspeed",
        "--set",
        "train.transformer_impl=local",
        "--set",
        "train.recompute=full",
        "--set",
        "parallel.zero_stage=3",
        "--warmup-steps",
        "10",
    )
    steady = [s for s in parse_log(LOG_DATA / "healthy_deepspeed.log").steps if s.step > 10]
    assert report["metrics"]["tokens_per_s"]["mean"] == pytest.approx(
        statistics.fmean(s.samples_per_s * 2048 for s in steady)
    )


def test_warmup_steps_flag(lmspec) -> None:
    log = str(LOG_DATA / "healthy_megatron.log")
    all_steps = logs_report(lmspec, log, *LLAMA_FLAGS, "--warmup-steps", "0")
    assert all_steps["steps_used"] == all_steps["steps_logged"]
    # the 31 s first iteration is in the statistics only without warm-up skip
    assert (
        all_steps["metrics"]["step_time_s"]["maximum"]
        > logs_report(lmspec, log, *LLAMA_FLAGS)["metrics"]["step_time_s"]["maximum"]
    )


def test_jsonl_without_job_uses_logged_mfu(lmspec, tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text((LOG_DATA / "healthy_lmspec_metrics.jsonl").read_text())
    report = logs_report(lmspec, str(tmp_path))
    steady = [s for s in parse_log(tmp_path).steps if s.step > 10]
    assert report["job"] is None and report["flops_per_token"] is None
    assert report["metrics"]["mfu"]["mean"] == pytest.approx(statistics.fmean(s.mfu for s in steady))
    assert report["metrics"]["tokens_per_s"]["mean"] == pytest.approx(statistics.fmean(s.tokens_per_s for s in steady))


def test_build_dir_gives_the_job(lmspec, tmp_path: Path) -> None:
    assert (
        lmspec(
            "compile",
            "model=llama3_8b",
            "hardware=h100_80g",
            "hardware.nodes=8",
            "parallel.distributed_optimizer=true",
            "-o",
            str(tmp_path),
        ).code
        == 0
    )
    from_build = logs_report(lmspec, str(LOG_DATA / "healthy_megatron.log"), "--build", str(tmp_path / "llama3_8b"))
    from_flags = logs_report(lmspec, str(LOG_DATA / "healthy_megatron.log"), *LLAMA_FLAGS)
    assert from_build["metrics"] == from_flags["metrics"] and from_build["job"].endswith(f"[{tmp_path / 'llama3_8b'}]")
    both = lmspec("logs", str(LOG_DATA / "healthy_megatron.log"), "--build", str(tmp_path / "llama3_8b"), "--gpus", "8")
    assert both.code == 2 and "--build takes the job from the build" in both.err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("custom_trainer.log",), "no training steps found"),
        (("custom_trainer.log", "--regex", "loss (?P<bogus>x)"), "are not fields lmspec reads"),
        (
            ("healthy_megatron.log", "--model", "llama3_8b", "--hardware", "h100_80g", "--gpus", "12"),
            "not a whole number of h100_80g nodes",
        ),
        (("healthy_megatron.log", "--plot", "out.pdf"), "use a .png or .svg"),
        (("healthy_megatron.log", "--build", "no/such/build"), "no/such/build is not a build directory"),
    ],
)
def test_usage_errors_exit_2(lmspec, argv: tuple[str, ...], message: str) -> None:
    result = lmspec("logs", str(LOG_DATA / argv[0]), *argv[1:])
    assert result.code == 2 and message in result.err and "Traceback" not in result.err


def test_plot_png_and_deterministic_svg(lmspec, tmp_path: Path) -> None:
    log = str(LOG_DATA / "healthy_megatron.log")
    for name in ("a.svg", "b.svg", "c.png"):
        assert lmspec("logs", log, *LLAMA_FLAGS, "--plot", str(tmp_path / name)).code == 0
    assert (tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    svg = (tmp_path / "a.svg").read_text()
    assert svg == (tmp_path / "b.svg").read_text()
    for label in ("loss", "learning rate", "tokens/s", "MFU"):
        assert label in svg


def test_spec_file_and_gpus(lmspec, tmp_path: Path) -> None:
    """A user's own spec file is the job; --gpus re-sizes it in whole nodes."""
    spec = tmp_path / "myjob.yaml"
    spec.write_text(
        "defaults:\n  - model: llama3_8b\n  - parallel: default\n  - train: default\n  - serve: default\n"
        "  - cluster: local\n  - convert: default\n  - hardware: h100_80g\n  - _self_\nname: myjob\n"
        "hardware:\n  nodes: 8\nparallel:\n  distributed_optimizer: true\n"
    )
    log = str(LOG_DATA / "healthy_megatron.log")
    assert logs_report(lmspec, log, "--spec", str(spec))["metrics"] == logs_report(lmspec, log, *LLAMA_FLAGS)["metrics"]
    quarter = logs_report(lmspec, log, "--spec", str(spec), "--gpus", "16")
    assert quarter["job"].startswith("llama3_8b on 16 x")
    full = logs_report(lmspec, log, *LLAMA_FLAGS)["metrics"]["mfu"]["mean"]
    assert quarter["metrics"]["mfu"]["mean"] == pytest.approx(4 * full)


def test_log_settings_give_tokens_without_a_job_and_flag_a_wrong_job(lmspec) -> None:
    """Megatron prints its arguments at start-up: seq_length gives tokens/s alone, and a job given
    with other numbers is called out."""
    log = str(LOG_DATA / "healthy_megatron.log")
    alone = logs_report(lmspec, log)
    assert alone["job"] is None and "mfu" not in alone["metrics"]
    assert alone["metrics"]["tokens_per_s"] == logs_report(lmspec, log, *LLAMA_FLAGS)["metrics"]["tokens_per_s"]
    assert logs_report(lmspec, log, *LLAMA_FLAGS)["warnings"] == []
    wrong = logs_report(
        lmspec,
        log,
        "--model",
        "llama3_8b",
        "--hardware",
        "h100_80g",
        "--gpus",
        "8",
        "--set",
        "parallel.distributed_optimizer=true",
        "--set",
        "train.global_batch_size=64",
    )
    assert [w.split(" but ")[0] for w in wrong["warnings"]] == [
        "the log ran global_batch_size=1024",
        "the log ran world_size=64",
    ]


def test_seq_length_alone_is_no_job(lmspec) -> None:
    """--seq-length without a job turns samples/s into tokens/s; it builds no default (tiny) job to refuse."""
    report = logs_report(
        lmspec, str(LOG_DATA / "corpus" / "nan-megatron-deepspeed-grad-norm-nan.log"), "--seq-length", "2048"
    )
    steps = parse_log(LOG_DATA / "corpus" / "nan-megatron-deepspeed-grad-norm-nan.log").steps
    assert report["job"] is None
    assert report["metrics"]["tokens_per_s"]["mean"] == pytest.approx(
        statistics.fmean(s.samples_per_s * 2048 for s in steps)
    )


@pytest.mark.parametrize(
    ("flags", "job", "broken"),
    [
        (("--model", "llama3_8b"), "llama3_8b on 2 x cpu", "training does not fit"),
        (("--hardware", "h100_80g"), "tiny on 8 x H100-SXM5-80GB", "exceeds model.max_position_embeddings"),
        (("--gpus", "8"), "tiny on 8 x cpu", "is not a multiple of train.micro_batch_size"),
        (("--set", "train.global_batch_size=64"), "global batch 64", None),
    ],
    ids=["model", "hardware", "gpus", "set"],
)
def test_every_job_flag_works_alone(lmspec, flags: tuple[str, str], job: str, broken: str | None) -> None:
    """A flag alone describes a job on the defaults; a rule that job breaks is a warning beside the numbers."""
    report = logs_report(lmspec, str(LOG_DATA / "healthy_megatron.log"), *flags)
    assert job in report["job"] and report["flops_per_token"] > 0
    broken_rules = [w for w in report["warnings"] if w.startswith("the job given breaks a rule")]
    assert (broken is None) == (not broken_rules)
    assert broken is None or broken in broken_rules[0]


def test_a_cpu_run_gets_no_gpu_verdict(lmspec, tmp_path: Path) -> None:
    """The README's job (the tiny model on the cpu preset): its MFU is shown, not judged by GPU thresholds."""
    assert lmspec("compile", "-o", str(tmp_path)).code == 0
    report = logs_report(
        lmspec, str(LOG_DATA / "corpus" / "healthy-lmspec-run-tiny-readme-job.log"), "--build", str(tmp_path / "tiny")
    )
    assert report["metrics"]["mfu"]["mean"] > 0
    assert report["verdict"].endswith("on a CPU preset: no verdict (the GPU thresholds do not apply to CPU ranks)")
