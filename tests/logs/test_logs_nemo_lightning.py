"""NeMo 2's iteration lines and PyTorch-Lightning's progress bars, read by `lmspec logs` from real excerpts.

The logs are copied verbatim from public threads (each file's `# source:` line): NeMo 2 from
NVIDIA-BioNeMo/bionemo-recipes#740 and NVIDIA-NeMo/Speech#10128, Lightning bars from
Lightning-AI/pytorch-lightning#4225 and #3755, hustvl/LightningDiT#73, and NeMo 1's bar from
NVIDIA/NeMo-Framework-Launcher#55 (and one line of the doctor corpus, tests/data/logs/corpus).
Formats: compiler/observe/logs/nemo.py and lightning.py.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
from helpers.logs_report import LLAMA_FLAGS, logs_report
from helpers.paths import LOG_DATA

from lmspec.compiler.observe.logs.context import load_flags
from lmspec.compiler.observe.logs.lightning import parse_lightning_line
from lmspec.compiler.observe.logs.nemo import parse_nemo_line
from lmspec.compiler.observe.logs.parse import parse_lines, parse_log


def _column(log, name: str) -> dict[int, float | int | None]:
    return {s.step: getattr(s, name) for s in log.steps}


def test_nemo2_iteration_lines_with_timing() -> None:
    """bionemo-recipes#740: global_step 120..125 are steps 121..126 (consumed_samples = (global_step + 1) x 1)."""
    log = parse_log(LOG_DATA / "healthy_nemo2_iterations.log")
    assert log.formats == ["nemo"]
    steps = list(range(121, 127))
    assert [s.step for s in log.steps] == steps
    assert [s.line for s in log.steps] == list(range(3, 9))  # after the two comment lines
    assert _column(log, "loss") == dict(zip(steps, (1.233, 1.288, 1.333, 1.245, 1.375, 1.34), strict=True))
    assert _column(log, "step_time_s") == dict(
        zip(steps, (0.03146, 0.03163, 0.03215, 0.03157, 0.0317, 0.03147), strict=True)
    )
    assert set(_column(log, "lr").values()) == {3e-05}
    assert set(_column(log, "global_batch_size").values()) == {1}
    assert set(_column(log, "val_loss").values()) == {None}  # the last validation, repeated: not the step's


def test_nemo2_iteration_lines_without_timing() -> None:
    """NeMo Speech#10128: iteration 0..8/9, global_step 0..8: steps 1..9; no timing callback, no step time."""
    log = parse_log(LOG_DATA / "healthy_nemo2_iterations_no_timing.log")
    assert log.formats == ["nemo"]
    losses = (11.02, 9.761, 9.21, 8.595, 8.675, 7.918, 7.319, 7.889, 7.113)
    assert _column(log, "loss") == dict(zip(range(1, 10), losses, strict=True))
    assert set(_column(log, "global_batch_size").values()) == {32}
    assert set(_column(log, "lr").values()) == {0.0006}
    assert set(_column(log, "step_time_s").values()) == {None}


def test_nemo2_line_shapes() -> None:
    line = (
        "Training epoch 0, iteration 3/9 | lr: 0.0006 | consumed_samples: 128 | global_batch_size: 32 | "
        "global_step: 3 | reduced_train_loss: 8.595"
    )
    record = parse_nemo_line(line, 7)
    assert record is not None and (record.step, record.line, record.loss) == (4, 7, 8.595)
    # without global_step, the iteration as printed
    bare = parse_nemo_line("Training epoch 1, iteration 50/100 | reduced_train_loss: nan", 1)
    assert bare is not None and bare.step == 50 and bare.loss != bare.loss  # NaN read as NaN
    assert parse_nemo_line("Validation: iteration 3/10", 1) is None
    # a rank prefix (torchrun --tee) is stripped before the parsers, as for every format
    log = parse_lines(["[default0]:" + line], "x")
    assert log.formats == ["nemo"] and [s.step for s in log.steps] == [4]


def test_megatron_iteration_lines_stay_megatron() -> None:
    log = parse_log(LOG_DATA / "healthy_megatron.log")
    assert log.formats == ["megatron"]


def test_lightning_bar_last_redraw_of_each_count() -> None:
    """pytorch-lightning#4225: each count is drawn twice, the postfix of the previous batch first; the paste
    ends one run mid-line at 6/18, then shows a run from its start (steps 1..5 again: the first kept)."""
    log = parse_log(LOG_DATA / "healthy_lightning_bar.log")
    assert log.formats == ["lightning"]
    assert [s.step for s in log.steps] == [1, 2, 3, 4, 5, 6]
    assert _column(log, "loss") == {1: 10.473, 2: 10.224, 3: 10.047, 4: 9.947, 5: 9.850, 6: None}
    assert _column(log, "step_time_s") == {1: 8.77, 2: 5.82, 3: 4.87, 4: 4.47, 5: 4.14, 6: None}


def test_lightning_bar_it_per_s_and_carriage_returns(tmp_path: Path) -> None:
    """LightningDiT#73 (Lightning 2.x, it/s): the rate is batches/s; its losses are not named as a loss. Written
    as tqdm writes a bar to a file, every redraw after a \\r on one physical line, the same steps are read."""
    source = LOG_DATA / "healthy_lightning_bar_it_per_s.log"
    log = parse_log(source)
    rates = {1: 0.27, 2: 0.33, 3: 0.39, 4: 0.41, 5: 0.44, 6: 0.46}
    assert _column(log, "step_time_s") == {step: 1 / rate for step, rate in rates.items()}
    assert set(_column(log, "loss").values()) == {None}
    bars = [line for line in source.read_text(encoding="utf-8").splitlines() if not line.startswith("#")]
    one_line = tmp_path / "tqdm.log"
    one_line.write_bytes(("".join("\r" + bar for bar in bars) + "\n").encode())
    redrawn = parse_log(one_line)
    assert redrawn.line_count == 1 + len(bars)  # each \r ends a line: the empty one before the first, then a redraw
    assert [(s.step, s.step_time_s, s.loss) for s in redrawn.steps] == [
        (s.step, s.step_time_s, s.loss) for s in log.steps
    ]


def test_lightning_bar_loss_names_epochs_and_global_step() -> None:
    # pytorch-lightning#3755: train_loss (logged) before loss (Lightning 1.x's running mean); epoch 1 of 72642
    (record,) = parse_log(LOG_DATA / "healthy_lightning_bar_train_loss.log").steps
    assert (record.step, record.loss, record.step_time_s) == (72642 + 49804, 0.255, 1 / 3.52)
    # NeMo-Framework-Launcher#55: NeMo 1's reduced_train_loss; global_step=794.0 is step 795 (the bar's count)
    (record,) = parse_log(LOG_DATA / "healthy_nemo1_lightning_bar.log").steps
    assert (record.step, record.loss, record.step_time_s) == (795, 3.090, 41.36)
    # the doctor corpus's NeMo 1 bar with a watchdog line glued on: global_step=3.2e+4 is tqdm's rounding, the count
    # is exact
    (record,) = parse_log(LOG_DATA / "corpus" / "nccl-timeout-nemo-progress-bar-glued-watchdog.log").steps
    assert (record.step, record.loss, record.step_time_s) == (32040, 2.590, 1 / 1.37)


def test_lightning_lines_that_are_no_training_step() -> None:
    for line in (
        "Training: 0it [00:00, ?it/s]",  # these three from pytorch-lightning#4225
        "Training:   0%|          | 0/18 [00:00<?, ?it/s]",
        "Epoch 0:   0%|          | 0/18 [00:00<?, ?it/s] ",
        "Validation DataLoader 0:  50%|█████     | 5/10 [00:01<00:01,  4.20it/s]",
    ):
        assert parse_lightning_line(line, 1) is None, line


def test_cli_prints_the_summary_of_each(lmspec) -> None:
    for name, summary in (
        ("healthy_nemo2_iterations.log", "(nemo): 6 logged steps, 6 used"),
        ("healthy_nemo2_iterations_no_timing.log", "(nemo): 9 logged steps, 9 used"),
        ("healthy_lightning_bar.log", "(lightning): 6 logged steps, 6 used"),
        ("healthy_lightning_bar_it_per_s.log", "(lightning): 6 logged steps, 6 used"),
        ("healthy_lightning_bar_train_loss.log", "(lightning): 1 logged steps, 1 used"),
        ("healthy_nemo1_lightning_bar.log", "(lightning): 1 logged steps, 1 used"),
    ):
        result = lmspec("logs", str(LOG_DATA / name))
        assert result.code == 0, result.err
        assert summary in result.out, result.out
    assert "last loss: 1.34" in lmspec("logs", str(LOG_DATA / "healthy_nemo2_iterations.log")).out
    assert "last loss: 9.85" in lmspec("logs", str(LOG_DATA / "healthy_lightning_bar.log")).out


def test_nemo2_tokens_per_s_from_its_batch_and_the_sequence_length(lmspec) -> None:
    """The line states the global batch and the step time: the sequence length alone gives tokens/s."""
    report = logs_report(lmspec, str(LOG_DATA / "healthy_nemo2_iterations.log"), "--seq-length", "8192")
    times = (0.03146, 0.03163, 0.03215, 0.03157, 0.0317, 0.03147)
    assert report["metrics"]["tokens_per_s"]["mean"] == pytest.approx(statistics.fmean(1 * 8192 / t for t in times))
    assert report["metrics"]["loss"]["mean"] == pytest.approx(
        statistics.fmean((1.233, 1.288, 1.333, 1.245, 1.375, 1.34))
    )


def test_lightning_tokens_per_s_and_mfu_from_the_job(lmspec) -> None:
    """A bar states no batch: the job's tokens per step over the bar's seconds per batch, as for any step time."""
    report = logs_report(lmspec, str(LOG_DATA / "healthy_lightning_bar.log"), *LLAMA_FLAGS)
    context = load_flags("llama3_8b", "h100_80g", 64, 4096, ["parallel.distributed_optimizer=true"])
    tokens = [context.tokens_per_step / t for t in (8.77, 5.82, 4.87, 4.47, 4.14)]
    assert report["metrics"]["tokens_per_s"]["mean"] == pytest.approx(statistics.fmean(tokens))
    assert report["metrics"]["tokens_per_s"]["count"] == 5  # step 6 (cut mid-line) has no rate
    assert report["metrics"]["mfu"]["mean"] > 0
