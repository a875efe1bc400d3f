"""`lmspec logs`/`doctor` read a log in bounded memory, and what they read is what they read
before: the block reader against bytes.splitlines, the scout against a plain substring search,
the step table against the dict merge parse_lines always did, a peak-RSS bound on a ~200 MB
log, and the same verdicts with a million noise lines inserted."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.cli import LMSPEC
from helpers.paths import LOG_DATA, ROOT

from lmspec.compiler.observe.logs import reader, table
from lmspec.compiler.observe.logs.reader import LogFile
from lmspec.compiler.observe.logs.scout import Needle, Scout
from lmspec.compiler.observe.logs.table import StepTable
from lmspec.compiler.observe.metrics_record import INT_FIELDS, METRIC_FIELDS, StepMetrics

_MEASURE = """
import json, resource, subprocess, sys
proc = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
print(json.dumps({"rc": proc.returncode, "err": proc.stderr.decode()[-2000:],
                  "peak_kib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))
"""


def _bench():
    spec = importlib.util.spec_from_file_location("logs_stream", ROOT / "bench" / "logs_stream.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_blocks_split_lines_as_bytes_splitlines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tiny reads and a tiny line bound, so every boundary case (a \\r\\n across two reads, a long line
    across many, bytes that are not UTF-8 cut anywhere) happens thousands of times."""
    monkeypatch.setattr(reader, "READ_BYTES", 7)
    monkeypatch.setattr(reader, "MAX_LINE_BYTES", 10)
    rng = random.Random(3)
    pieces = [b"a", b"\n", b"\r", b"\r\n", b"\xc3\xa9", b"\xff", b"\xe2\x80", b"xyz" * 3, b"\n\n", b"\x0c", b"\x85"]
    for _ in range(3000):
        data = b"".join(rng.choice(pieces) for _ in range(rng.randrange(40)))
        (tmp_path / "x.log").write_bytes(data)
        log = LogFile(tmp_path / "x.log")
        lines = data.splitlines()
        assert list(log.lines()) == [line[:10].decode("utf-8", errors="replace") for line in lines], data
        assert (log.line_count, log.long_lines) == (len(lines), sum(len(line) > 10 for line in lines))


def test_block_lines_decode_as_the_whole_text_did(tmp_path: Path) -> None:
    """Lines split on \\n, \\r\\n, \\r and then decoded one by one equal the text decoded whole and
    then split there (bytes that are not UTF-8 replaced alike). Unlike str.splitlines, form feeds,
    \\x1c-\\x1e, U+0085 and U+2028/9 end no line: a log line is what a terminal shows as one."""
    rng = random.Random(5)
    for _ in range(300):
        data = bytes(rng.choice(b"ab\n\r\x0c\xc3\xa9\xe2\x82\xac\x80\xa9\xf0\x9f\x98\xff\x85\xc2") for _ in range(200))
        (tmp_path / "x.log").write_bytes(data)
        text = data.decode("utf-8", errors="replace").replace("\r\n", "\n").replace("\r", "\n").split("\n")
        assert list(LogFile(tmp_path / "x.log").lines()) == (text[:-1] if text[-1] == "" else text)


def test_scout_finds_every_line_holding_a_needle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reader, "READ_BYTES", 4096)
    rng = random.Random(7)
    needles = [Needle(b"|"), Needle(b"step="), Needle(b"NCCL WARN "), Needle(b"lr"), Needle(b"nan iter", True)]
    words = [b"step", b"step=", b"NCCL", b"WARN ", b"NCCL WARN ", b"|", b"l", b"r", b"lr", b"NaN ITER", b"nan", b"x"]
    lines = [b" ".join(rng.choice(words) for _ in range(rng.randrange(6))) for _ in range(20_000)]
    (tmp_path / "x.log").write_bytes(b"\n".join(lines))
    scout = Scout(needles)
    seen = 0
    for block in LogFile(tmp_path / "x.log").blocks():
        found, masks = scout.candidates(block)
        candidates = dict(zip(found.tolist(), masks.tolist(), strict=True))
        for i in range(len(block)):
            raw = block.raw(i)
            for needle in needles:
                if needle.text in (raw.lower() if needle.ignore_case else raw):
                    assert i in candidates and needle in scout.needles_in(candidates[i]), (raw, needle)
                    seen += 1
    assert seen > 10_000


def _reference(records: list[StepMetrics]) -> list[StepMetrics]:
    """parse_lines' merge before the table: a dict by step, the first record of a step kept."""
    by_step: dict[int, StepMetrics] = {}
    for record in records:
        if record.step in by_step:
            by_step[record.step] = by_step[record.step].filled_from(record)
        else:
            by_step[record.step] = record
    return [by_step[step] for step in sorted(by_step)]


def _records(rng: random.Random, steps: list[int]) -> list[StepMetrics]:
    records = []
    for line, step in enumerate(steps, start=1):
        values: dict[str, int | float] = {}
        for name in rng.sample(METRIC_FIELDS, rng.randrange(len(METRIC_FIELDS))):
            if name in INT_FIELDS:
                values[name] = rng.choice([rng.randrange(10**6), 10**30])
            else:
                values[name] = rng.choice([rng.random(), float("inf"), float("nan"), -0.0])
        records.append(StepMetrics(step=step, line=line, **values))  # type: ignore[arg-type]
    return records


def _same(a: StepMetrics, b: StepMetrics) -> bool:
    return all(
        x == y or (x != x and y != y)
        for x, y in ((getattr(a, f), getattr(b, f)) for f in ("step", "line", *METRIC_FIELDS))
    )


def test_table_merges_steps_as_the_dict_did(monkeypatch: pytest.MonkeyPatch) -> None:
    """Duplicates (DeepSpeed's two lines a step), restarts (steps logged again) and steps out of
    order, with a small pending dict so its merges into the columns happen often."""
    monkeypatch.setattr(table, "PENDING_STEPS", 16)
    rng = random.Random(11)
    for _ in range(40):
        steps = [s for s in range(1, 400) for _ in range(rng.choice([1, 1, 2]))]
        steps[100:100] = list(range(50, 150))  # a restart from step 50
        steps += rng.sample(range(-50, 1000), 200)
        records = _records(rng, steps)
        t = StepTable()
        for record in records:
            t.add(record)
        expected = _reference(records)
        got = list(t.records())
        assert len(got) == len(expected) == t.distinct and t.stride == 1
        assert all(_same(a, b) for a, b in zip(got, expected, strict=True))


def test_table_past_its_bound_keeps_every_kth_step_and_exact_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(table, "MAX_EXACT_STEPS", 64)
    rng = random.Random(13)
    steps = [s for s in range(1, 1001) for _ in range(rng.choice([1, 2]))]
    records = [
        dataclasses.replace(r, loss=float(r.step), peak_memory_bytes=r.step if r.step != 333 else 10**6)
        for r in _records(rng, steps)
    ]
    t = StepTable(count_above=10)
    for record in records:
        t.add(record)
    kept = list(t.records())
    assert t.stride > 1 and len(kept) <= 64
    assert [r.step for r in kept] == [s for s in range(1, 1001) if s % t.stride == 0]
    reference = {r.step: r for r in _reference(records)}
    assert all(_same(r, reference[r.step]) for r in kept)
    assert t.distinct == 1000 and t.dropped_above + sum(r.step > 10 for r in kept) == 990
    assert t.dropped_peak == 10**6 and t.dropped_last_loss in (None, (999, 999.0), (1000, 1000.0))
    assert t.sampled_note() and f"every {t.stride}th step" in t.sampled_note()


def test_thinning_that_leaves_no_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every step odd: the first thinning keeps none; later steps, even ones among them, still count."""
    monkeypatch.setattr(table, "MAX_EXACT_STEPS", 8)
    t = StepTable()
    for step in [*range(1, 40, 2), 20, 2, 40]:
        t.add(StepMetrics(step=step, loss=1.0))
    assert t.stride == 2 and [r.step for r in t.records()] == [2, 20, 40] and t.distinct == 23


def test_sampled_report_keeps_counts_last_loss_and_peak(monkeypatch: pytest.MonkeyPatch) -> None:
    from lmspec.compiler.observe.logs.parse import parse_lines
    from lmspec.compiler.observe.logs.report import build_report

    lines = [
        f"step {s:>6} | loss {1 + 1 / s:.4f} | lr 1.000e-03 | grad_norm 0.500 | 4,000 tokens/s | 500 ms/step | "
        f"MFU 15.00% | peak mem {400 + (s == 777) * 1000} MiB"
        for s in range(1, 2001)
    ]
    exact = build_report(parse_lines(lines, "x"), None, 10)
    monkeypatch.setattr(table, "MAX_EXACT_STEPS", 100)
    sampled = build_report(parse_lines(lines, "x"), None, 10)
    assert (sampled.steps_logged, sampled.steps_used) == (exact.steps_logged, exact.steps_used) == (2000, 1990)
    assert sampled.last_loss == exact.last_loss and sampled.peak_memory_bytes == exact.peak_memory_bytes
    assert sampled.metrics["tokens_per_s"].mean == exact.metrics["tokens_per_s"].mean == 4000
    assert sampled.metrics["loss"].count < 100 and "every" in sampled.warnings[-1]


def _peak_rss_kib(argv: list[str]) -> int:
    out = subprocess.run(
        [sys.executable, "-c", _MEASURE, *argv], capture_output=True, text=True, timeout=600, check=True, cwd=ROOT
    )
    result = json.loads(out.stdout)
    assert result["rc"] in (0, 1) and "Traceback" not in result["err"], result["err"]
    return result["peak_kib"]


@pytest.mark.slow
def test_peak_memory_does_not_grow_with_the_log(tmp_path: Path) -> None:
    """Bounded memory is a property, not a timing: the peak RSS of reading a ~200 MB log is a
    small step above that of reading a 12 KB one, for both commands."""
    big, small = tmp_path / "big.log", tmp_path / "small.log"
    info = _bench().generate(big, 200 * 1024 * 1024)
    small.write_bytes(big.read_bytes()[: 12 * 1024].rsplit(b"\n", 1)[0] + b"\n")
    for command in ("logs", "doctor"):
        base = _peak_rss_kib([LMSPEC, command, str(small)])
        peak = _peak_rss_kib([LMSPEC, command, str(big)])
        growth_mb = (peak - base) / 1024
        assert growth_mb < info["bytes"] / 1e6 / 4, (command, base, peak)  # far below the 210 MB read


def _with_noise(log: Path, out: Path, noise_lines: int) -> list[int]:
    """The log with `noise_lines` noise lines spread between its lines; where each line went."""
    bench = _bench()
    rng = random.Random(17)
    lines = log.read_text().splitlines()
    cuts = sorted(rng.randrange(len(lines) + 1) for _ in range(noise_lines))
    where, at, cut = [], 0, 0
    with out.open("w") as f:
        for i, line in enumerate([*lines, None]):
            while cut < len(cuts) and cuts[cut] == i:
                template = bench._NOISE[rng.randrange(len(bench._NOISE))]
                f.write(template.format(host="n1", pid=1, tid=cut, rank=3, peer=4, ch=7, stamp="12:00", day=1) + "\n")
                at += template.count("\r") + 1
                cut += 1
            if line is not None:
                f.write(line + "\n")
                at += 1
                where.append(at)
    return where


@pytest.mark.slow
@pytest.mark.parametrize(
    "log",
    ["healthy_megatron.log", "torchrun_nccl_timeout.log", "megatron_nan.log", "deepspeed_loss_scale_collapse.log"],
)
def test_verdicts_unchanged_by_a_million_noise_lines(lmspec, tmp_path: Path, log: str) -> None:
    noisy = tmp_path / log
    where = _with_noise(LOG_DATA / log, noisy, 1_000_000)
    plain_report = json.loads(lmspec("logs", str(LOG_DATA / log), "--format", "json").out or "null")
    noisy_report = json.loads(lmspec("logs", str(noisy), "--format", "json").out or "null")
    if plain_report is not None:
        assert {**noisy_report, "log": None} == {**plain_report, "log": None}
    plain, noisy_doctor = (
        lmspec("doctor", str(LOG_DATA / log), "--format", "json"),
        lmspec("doctor", str(noisy), "--format", "json"),
    )
    assert noisy_doctor.code == plain.code
    expected = json.loads(plain.out)
    for finding in expected:  # the same lines, where the noise moved them
        finding["evidence"] = [{**e, "line": where[e["line"] - 1] if e["line"] else 0} for e in finding["evidence"]]
        for fix in finding["fixes"]:
            fix["why"] = re.sub(r"log line (\d+)", lambda m: f"log line {where[int(m.group(1)) - 1]}", fix["why"])
    assert json.loads(noisy_doctor.out) == expected
