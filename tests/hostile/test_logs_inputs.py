"""Damaged and hostile inputs to `lmspec logs` and `lmspec doctor`: each gives exit 2 (usage/IO)
with one line naming the file, or a clean verdict; never a traceback, never a hang.

One pytest.param per input: (how to make it, the command, expected exit, fragments on stderr,
fragments on stdout). `{log}` in a fragment stands for the path given.
"""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
import os
import random
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers.paths import LOG_DATA

MEGATRON = (LOG_DATA / "healthy_megatron.log").read_bytes()
OOM = (LOG_DATA / "cuda_oom.log").read_bytes()
JSONL = (LOG_DATA / "healthy_lmspec_metrics.jsonl").read_bytes()
MB = 1024 * 1024


def _file(content: bytes, name: str = "train.log") -> Callable[[Path], Path]:
    def make(tmp: Path) -> Path:
        (tmp / name).write_bytes(content)
        return tmp / name

    return make


def _run_dir(files: dict[str, bytes]) -> Callable[[Path], Path]:
    def make(tmp: Path) -> Path:
        run = tmp / "run"
        run.mkdir()
        for name, content in files.items():
            (run / name).write_bytes(content)
        return run

    return make


def _missing(tmp: Path) -> Path:
    return tmp / "no_such.log"


def _fifo(tmp: Path) -> Path:
    os.mkfifo(tmp / "pipe.log")  # nobody writes: reading it would block forever
    return tmp / "pipe.log"


def _fifo_metrics(tmp: Path) -> Path:
    (tmp / "run").mkdir()
    os.mkfifo(tmp / "run" / "metrics.jsonl")
    return tmp / "run"


def _loop(tmp: Path) -> Path:
    (tmp / "a.log").symlink_to(tmp / "b.log")
    (tmp / "b.log").symlink_to(tmp / "a.log")
    return tmp / "a.log"


def _dangling(tmp: Path) -> Path:
    (tmp / "gone.log").symlink_to(tmp / "deleted.log")
    return tmp / "gone.log"


def _one_long_line(tmp: Path) -> Path:
    path = tmp / "oneline.log"
    with path.open("wb") as out:
        for _ in range(50):
            out.write(b"x" * MB)  # 50 MB, no newline
    return path


def _long_line_then_log(tmp: Path) -> Path:
    path = tmp / "long_then_oom.log"
    path.write_bytes(b"y" * (3 * MB) + b"\n" + OOM)
    return path


def _garbage(tmp: Path) -> Path:
    path = tmp / "garbage.log"
    path.write_bytes(random.Random(14).randbytes(256 * 1024))
    return path


def _damaged_gzip(tmp: Path) -> Path:
    path = tmp / "train.log.gz"
    path.write_bytes(gzip.compress(MEGATRON * 50)[:-400])  # cut short: no end-of-stream marker
    return path


def _jsonl(*rows: object) -> bytes:
    return b"".join((row if isinstance(row, bytes) else json.dumps(row).encode()) + b"\n" for row in rows)


LATIN1 = MEGATRON.replace(b"training ...", "training \xe9t\xe9 ...".encode("latin-1"))
NAN_JSONL = _jsonl(
    {"step": 5, "loss": 5.8, "tokens_per_s": 700.0, "step_time_s": 2.9},
    b'{"step": 10, "loss": NaN, "grad_norm": Infinity, "peak_memory_bytes": NaN}',
)
CASES = [
    pytest.param(_missing, "logs", 2, ["{log}: no such log file or run directory"], [], id="missing-file"),
    pytest.param(_missing, "doctor", 2, ["{log}: no such log file"], [], id="missing-file-doctor"),
    pytest.param(_run_dir({}), "logs", 2, ["{log} holds none of metrics.jsonl"], [], id="run-dir-without-metrics"),
    pytest.param(_run_dir({"notes.txt": b"hi\n"}), "doctor", 2, ["{log} holds none of"], [], id="run-dir-doctor"),
    pytest.param(_fifo, "logs", 2, ["{log} is a FIFO, not a log file"], [], id="fifo"),
    pytest.param(_fifo, "doctor", 2, ["{log} is a FIFO"], [], id="fifo-doctor"),
    pytest.param(_fifo_metrics, "logs", 2, ["{log} holds none of"], [], id="fifo-as-metrics-jsonl"),
    pytest.param(lambda tmp: Path("/dev/zero"), "logs", 2, ["/dev/zero is a device"], [], id="endless-device"),
    pytest.param(_loop, "logs", 2, ["{log}: cannot open the log"], [], id="symlink-loop"),
    pytest.param(_dangling, "doctor", 2, ["{log}: cannot open the log (No such file"], [], id="dangling-symlink"),
    pytest.param(_file(b""), "logs", 2, ["{log}: no training steps found"], [], id="empty-file"),
    pytest.param(_file(b""), "doctor", 0, [], ["{log}: healthy", "in 0 lines"], id="empty-file-doctor"),
    pytest.param(_file(b"\n\n  \n"), "logs", 2, ["no training steps found"], [], id="blank-lines"),
    pytest.param(_garbage, "logs", 2, ["{log} is not a text log", "binary control bytes"], [], id="binary-garbage"),
    pytest.param(_garbage, "doctor", 2, ["{log} is not a text log"], [], id="binary-garbage-doctor"),
    pytest.param(_file(b"\0" * 4096 + MEGATRON), "logs", 2, ["is not a text log"], [], id="nul-filled-head"),
    pytest.param(_file("step 5 loss 1.0\n".encode("utf-16")), "doctor", 2, ["is not a text log"], [], id="utf16-log"),
    pytest.param(_file(LATIN1), "logs", 0, [], ["60 logged steps", "tokens/s"], id="non-utf8-bytes"),
    pytest.param(_file(LATIN1), "doctor", 0, [], ["{log}: healthy"], id="non-utf8-bytes-doctor"),
    pytest.param(
        _file(b"\xff\xfe\xc3(\xe2\x82" * 1000 + b"\n"), "logs", 2, ["no training steps found"], [], id="invalid-utf8"
    ),
    pytest.param(
        _one_long_line,
        "logs",
        2,
        ["1 line(s) longer than 64 KiB", "no training steps found"],
        [],
        id="50mb-line-no-newline",
    ),
    pytest.param(
        _one_long_line,
        "doctor",
        0,
        ["warning: {log}: 1 line(s) longer than 64 KiB"],
        ["in 1 lines"],
        id="50mb-line-doctor",
    ),
    pytest.param(
        _long_line_then_log,
        "doctor",
        1,
        ["longer than 64 KiB"],
        ["CUDA out of memory", "L8: [rank0]: torch.OutOfMemoryError"],
        id="long-line-then-oom",
    ),
    pytest.param(_file(gzip.compress(MEGATRON), "train.log.gz"), "logs", 0, [], ["60 logged steps"], id="gzip"),
    pytest.param(_file(gzip.compress(OOM), "oom.log.gz"), "doctor", 1, [], ["CUDA out of memory"], id="gzip-doctor"),
    pytest.param(_damaged_gzip, "logs", 2, ["{log}: damaged gzip data"], [], id="truncated-gzip"),
    pytest.param(
        _file(gzip.compress(b"\0" * 2048 + b"ustar")), "logs", 2, ["is not a text log"], [], id="gzip-of-binary"
    ),
    pytest.param(
        _file(b"\x28\xb5\x2f\xfd" + bytes(64), "t.log.zst"), "logs", 2, ["{log} is zstd-compressed"], [], id="zstd"
    ),
    pytest.param(_file(b"PK\x03\x04" + bytes(64), "t.zip"), "doctor", 2, ["{log} is a zip archive"], [], id="zip"),
    pytest.param(
        _file(bz2.compress(OOM), "t.log.bz2"), "doctor", 2, ["{log} is bzip2-compressed", "bzip2 -d"], [], id="bz2"
    ),
    pytest.param(_file(lzma.compress(OOM), "t.log.xz"), "logs", 2, ["{log} is xz-compressed"], [], id="xz"),
    pytest.param(_file(b"BZh9 is how this log starts\n" + OOM), "doctor", 1, [], ["CUDA out of memory"], id="bzh-text"),
    pytest.param(
        _run_dir({"metrics.jsonl": JSONL[:200] + b"\n{not json\n\x00\x01garbage\n" + JSONL}),
        "logs",
        0,
        [],
        ["lmspec-jsonl"],
        id="metrics-jsonl-garbage-lines",
    ),
    pytest.param(
        _run_dir({"metrics.jsonl": _jsonl([1, 2, 3], ["step", 5], [{"step": 1}])}),
        "logs",
        2,
        ["metrics.jsonl: no training steps found"],
        [],
        id="metrics-jsonl-list-per-line",
    ),
    pytest.param(
        _run_dir({"metrics.jsonl": NAN_JSONL}), "logs", 0, [], ["2 logged steps", "last loss: nan"], id="jsonl-nan"
    ),
    pytest.param(_run_dir({"metrics.jsonl": NAN_JSONL}), "doctor", 1, [], ['"loss": NaN'], id="jsonl-nan-doctor"),
    pytest.param(
        _run_dir({"metrics.jsonl": _jsonl({"step": 3, "loss": 1.0}) + b"[" * 50_000 + b"\n"}),
        "logs",
        0,
        [],
        ["1 logged steps"],
        id="jsonl-nested-too-deep",
    ),
    pytest.param(
        _run_dir(
            {
                "metrics.jsonl": _jsonl(
                    {"step": 10**30, "loss": 1.0},
                    {"step": "5", "loss": 1.0},
                    {"step": 7, "peak_memory_bytes": 10**40, "global_batch_size": 1e300, "nan_iterations": -1e999},
                )
            }
        ),
        "logs",
        0,
        [],
        ["1 logged steps", "peak memory: 9313225746154785439172786126848.00 GiB"],
        id="jsonl-absurd-numbers",
    ),
    pytest.param(
        _file(b" iteration " + b"9" * 5000 + b"/ 10 | lm loss: 1.0 |\n"),
        "logs",
        2,
        ["no training steps found"],
        [],
        id="megatron-5000-digit-step",
    ),
    pytest.param(
        _file(b" iteration 3/ 10 | global batch size: nan | number of nan iterations: inf | lm loss: 2.0 |\n"),
        "logs",
        0,
        [],
        ["1 logged steps", "last loss: 2"],
        id="megatron-nan-counts",
    ),
    pytest.param(
        _file(
            b"step 5 | loss 1.0 | lr 1e-3 | grad_norm 0.5 | 1.2.3 tokens/s | 9.9.9 ms/step | MFU 1.2.3% | "
            b"peak mem 1e999 MiB\n"
        ),
        "logs",
        2,
        ["no training steps found"],
        [],
        id="lmspec-stdout-bad-numbers",
    ),
    pytest.param(
        _file(
            b"epoch=0/micro_step=2/global_step=1, RunningAvgSamplesPerSec=x, CurrSamplesPerSec=abc, "
            b"MemAllocated=1.2.3GB, MaxMemAllocated=4.5.6GB\n[Rank 0] step=1, skipped=0, lr=[0.001]\n"
        ),
        "logs",
        0,
        [],
        ["deepspeed", "1 logged steps"],
        id="deepspeed-bad-numbers",
    ),
    pytest.param(
        _file(
            b"[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 2, reducing to " + b"1" * 5000 + b"\n"
        ),
        "doctor",
        0,
        [],
        ["healthy"],
        id="overflow-5000-digit-scale",
    ),
    pytest.param(  # 6,500 tries of "NCCL WARN .*(connect|...)" each to the line's end: 38 s a line before
        _file(b"NCCL WARN " * 6500 + b"\n" + b"ibv_" * 16000 + b"\n" + b"NCCL INFO " * 6500 + b"\n"),
        "doctor",
        0,
        [],
        ["healthy", "in 3 lines"],
        id="backtracking-bait-lines",
    ),
    pytest.param(
        _file(b"lr " * 21000 + b"\n" + b"loss " * 13000 + b"loss: NaN\n"),
        "doctor",
        1,
        [],
        ["NaN/Inf loss", "L2: ... loss loss", "loss: NaN"],
        id="many-start-words",
    ),
    pytest.param(
        _file(b"progress 10%\rprogress 50%\r" + MEGATRON.replace(b"\n", b"\r\n")),
        "logs",
        0,
        [],
        ["60 logged steps"],
        id="crlf-and-carriage-returns",
    ),
]


@pytest.mark.parametrize(("make", "command", "code", "err", "out"), CASES)
def test_damaged_log_input(
    lmspec, tmp_path: Path, make: Callable[[Path], Path], command: str, code: int, err: list[str], out: list[str]
) -> None:
    log = make(tmp_path)
    result = lmspec(command, str(log))
    result.assert_reports(code, [f.format(log=log) for f in err])
    for fragment in out:
        assert fragment.format(log=log) in result.out, result.out
    if code == 2:  # one error line, naming the file (warnings may come before it)
        errors = [line for line in result.err.splitlines() if not line.startswith("warning: ")]
        assert len(errors) == 1 and str(log) in errors[0], result.err


def test_regex_capturing_inf_for_a_count(lmspec, tmp_path: Path) -> None:
    log = tmp_path / "custom.log"
    log.write_text("step 1 mem inf\nstep 2 mem 1e999\nstep 3 mem 12\n")
    result = lmspec(
        "logs", str(log), "--regex", r"step (?P<step>\d+) mem (?P<peak_memory_bytes>\S+)", "--format", "json"
    )
    result.assert_reports(0, [])
    report = json.loads(result.out)
    assert report["steps_logged"] == 1 and report["peak_memory_bytes"] == 12


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_unreadable_log(lmspec, tmp_path: Path) -> None:
    log = tmp_path / "secret.log"
    log.write_bytes(MEGATRON)
    log.chmod(0)
    lmspec("logs", str(log)).assert_reports(2, [f"{log}: cannot open the log (Permission denied)"])
