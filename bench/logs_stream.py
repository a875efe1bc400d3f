"""Do `lmspec logs` and `lmspec doctor` stream? Time and peak memory on a generated 1 GB log.

The log is what a long Megatron run under torchrun writes with NCCL_DEBUG=INFO: start-up argument
printout, one `iteration N/ M | ...` line per step behind `[defaultR]:` rank prefixes, Megatron's
timers and `report_memory` lines, NCCL INFO chatter, Python warnings, data-loader prints, tqdm
redraws (carriage returns), an occasional multi-kilobyte config dump, lmspec's own human metrics
line for some steps, a few non-UTF-8 bytes, and near the end the failure signatures of a dying run
(NaN iterations, a CUDA OOM, an NCCL watchdog timeout, Slurm's time limit).

Each command runs as its own process (what a user pays: imports included), repeated; peak RSS
is the child's `ru_maxrss` (resource.getrusage(RUSAGE_CHILDREN) of a fresh helper per run, so one
run's peak does not hide the next's). As a floor the same file is read by `cat > /dev/null` and
`wc -l` in the same session: the machine's own read speed for this file right now. Medians are
reported; the targets (issue 14: >= 50 MB/s, <= 300 MB peak RSS for a 1 GB log) are checked
here, never as timed asserts in tests.

    .venv/bin/python bench/logs_stream.py [--size-mb 1024] [--dir /tmp] [--repeats 3] [--keep]

Exit 1 when a target is missed, 2 when a command fails.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET_MB_PER_S = 50.0
TARGET_PEAK_RSS_MB = 300.0
LMSPEC = "from lmspec.compiler.cli.main import main; main()"  # what the `lmspec` console script runs
# Runs `argv` and prints its wall time and peak RSS: RUSAGE_CHILDREN of this helper holds only that child.
_MEASURE = """
import json, resource, subprocess, sys, time
start = time.perf_counter()
proc = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
wall = time.perf_counter() - start
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"rc": proc.returncode, "wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime,
                  "peak_rss_kib": usage.ru_maxrss, "stderr": proc.stderr.decode(errors="replace")[-2000:]}))
"""

_NOISE = (
    "{host}:{pid}:{tid} [{rank}] NCCL INFO Channel {ch:02d}/0 : {rank}[{rank}] -> {peer}[{peer}] via P2P/IPC/read",
    "{host}:{pid}:{tid} [{rank}] NCCL INFO Connected all rings, use ring PXN 0 GDR 1",
    "{host}:{pid}:{tid} [{rank}] NCCL INFO ncclCommInitRank comm 0x55d1c7a3e2b0 rank {rank} nranks 64 "
    "cudaDev {rank} nvmlDev {rank} busId {ch}0 commId 0x9f3a1c - Init COMPLETE",
    "/opt/conda/lib/python3.11/site-packages/torch/utils/checkpoint.py:{ch}: UserWarning: "
    "torch.utils.checkpoint: the use_reentrant parameter should be passed explicitly.",
    "  warnings.warn(",
    " > loading shard {ch} of /data/fineweb/train_{pid}.bin: {tid} documents",
    "[{stamp}] INFO:megatron.core.dist_checkpointing:Loaded {tid} bytes in 0.{ch} s",
    "(min, max) time across ranks (ms):",
    "    forward-backward ...............................: (6921.{ch}, 6934.{rank})",
    "    optimizer ......................................: (112.{ch}, 118.{rank})",
    "    batch-generator ................................: (0.{ch}, 2.{rank})",
    "evaluating: {ch}%|####      | {ch}/100 [00:0{rank}<00:07, 13.5it/s]\revaluating: 1{ch}%|#####  | "
    "1{ch}/100 [00:0{rank}<00:06, 13.6it/s]",
    '{{"event": "heartbeat", "rank": {rank}, "host": "{host}", "t": {tid}}}',
    "W{day} {stamp} {pid} torch/distributed/run.py:793] Setting OMP_NUM_THREADS environment variable to 1",
    "caf\xe9 data loader worker {rank} started (non-ASCII text in a path: /data/m\xfcnchen/{ch})",
)
_ITERATION = (
    " [{stamp}] iteration {step:>8}/ 1000000 | consumed samples: {samples:>12} | elapsed time per iteration "
    "(ms): {ms:.1f} | throughput per GPU (TFLOP/s/GPU): {tflops:.1f} | learning rate: {lr:.6E} | "
    "global batch size:  1024 | lm loss: {loss:.6E} | loss scale: 1.0 | grad norm: {gn:.3f} | "
    "number of skipped iterations:   0 | number of nan iterations:   {nan} |"
)
_MEMORY = (
    "[Rank 0] (after {step} iterations) memory (MB) | allocated: 29815.42 | max allocated: {peak:.2f} | "
    "reserved: 63410.00 | max reserved: 63410.00"
)
_LMSPEC = (
    "step {step:>6} | loss {loss:.4f} | lr {lr:.3e} | grad_norm {gn:.3f} | {tps:,.0f} tokens/s | "
    "{ms:.0f} ms/step | MFU {mfu:.2f}% | peak mem {mib:,.0f} MiB"
)
_HEADER = """\
------------------------ arguments ------------------------
  global_batch_size ............................... 1024
  micro_batch_size ................................ 1
  pipeline_model_parallel_size .................... 1
  seq_length ...................................... 4096
  tensor_model_parallel_size ...................... 1
  world_size ...................................... 64
-------------------- end of arguments ---------------------
"""
# The end of a dying run: every line matches a doctor signature.
_FAILURES = (
    "[default0]: [{stamp}] iteration {step:>8}/ 1000000 | consumed samples: 1 | elapsed time per iteration (ms): "
    "7012.4 | learning rate: 3.000000E-04 | global batch size:  1024 | loss scale: 1.0 | grad norm: nan | "
    "number of skipped iterations:   1 | number of nan iterations:   2 |",
    "[rank3]:[E1122 03:24:08.117 ProcessGroupNCCL.cpp:632] [Rank 3] Watchdog caught collective operation timeout: "
    "WorkNCCL(SeqNum=48213, OpType=ALLREDUCE, NumelIn=50331648, NumelOut=50331648, Timeout(ms)=600000) ran for "
    "600041 milliseconds before timing out.",
    "[rank0]:[E1122 03:24:08.118 ProcessGroupNCCL.cpp:670] [Rank 0] Some NCCL operations have failed or timed out. "
    "Due to the asynchronous nature of CUDA kernels, subsequent GPU operations might run on corrupted data.",
    "[rank5]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.50 GiB. GPU 5 has a total capacity "
    "of 79.11 GiB of which 1.02 GiB is free. Including non-PyTorch memory, this process has 78.08 GiB memory in use.",
    "slurmstepd: error: *** JOB 4151016 ON gpu-node-003 CANCELLED AT 2026-11-22T03:30:00 DUE TO TIME LIMIT ***",
)
DOCTOR_SIGNATURES = ("nan_loss", "nccl_timeout", "cuda_oom", "slurm_time_limit")


def generate(path: Path, size_bytes: int, seed: int = 14) -> dict[str, int]:
    """Write the log (deterministic for a seed); returns its line and step counts."""
    rng = random.Random(seed)
    host, pid = "gpu-node-003", 48211
    lines = steps = 0
    written = 0
    with path.open("wb") as out:
        out.write(_HEADER.encode())
        step = 0
        while written < size_bytes:
            block = []
            for _ in range(200):
                step += 1
                rank = rng.randrange(8)
                stamp = f"2026-11-22 03:{step // 60 % 60:02d}:{step % 60:02d}.{rng.randrange(10**6):06d}"
                ms = 7000 + rng.random() * 200
                loss = 2.0 + 9.0 / (1 + step / 5000) + rng.random() * 0.01
                lr = 3e-4 * min(1.0, step / 2000)
                block.append(
                    f"[default{rank}]:"
                    + _ITERATION.format(
                        stamp=stamp,
                        step=step,
                        samples=step * 1024,
                        ms=ms,
                        tflops=447.0 * 7050 / ms,
                        lr=lr,
                        loss=loss,
                        gn=0.3 + rng.random(),
                        nan=0,
                    )
                )
                if step % 10 == 0:
                    block.append(_MEMORY.format(step=step, peak=61204.87 + rng.random() * 100))
                if step % 7 == 0:
                    tps = 1024 * 4096 / ms * 1000
                    block.append(
                        _LMSPEC.format(
                            step=step, loss=loss, lr=lr, gn=0.5, tps=tps, ms=ms, mfu=45.1, mib=58000 + step % 97
                        )
                    )
                for _ in range(rng.randrange(20, 60)):
                    template = _NOISE[rng.randrange(len(_NOISE))]
                    block.append(
                        template.format(
                            host=host,
                            pid=pid,
                            tid=rng.randrange(10**6),
                            rank=rank,
                            peer=(rank + 1) % 8,
                            ch=rng.randrange(32),
                            stamp=stamp,
                            day=1122,
                        )
                    )
                if rng.random() < 0.002:  # a config dump on one line
                    block.append("config: " + json.dumps({f"key_{i}": "x" * 40 for i in range(100)}))
            if rng.random() < 0.05:
                block.append("garbled \udcff\udcfe bytes from a dying rank")  # lone surrogates: bytes not UTF-8
            data = ("\n".join(block) + "\n").encode("utf-8", errors="surrogateescape")
            out.write(data)
            written += len(data)
            lines += len(block)
            steps = step
        tail = []
        for template in _FAILURES:
            step += 1
            stamp = f"2026-11-22 03:{step // 60 % 60:02d}:{step % 60:02d}.000000"
            tail.append(template.format(stamp=stamp, step=step))
        out.write(("\n".join(tail) + "\n").encode())
    return {"bytes": path.stat().st_size, "lines": lines + len(tail) + _HEADER.count("\n"), "steps": steps + 1}


def _measure(argv: list[str]) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", _MEASURE, *argv], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def _lmspec(*argv: str) -> list[str]:
    return [sys.executable, "-c", LMSPEC, *argv]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=int, default=1024, help="size of the generated log (default 1024)")
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()), help="where to write it (/tmp)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each command (medians are reported)")
    parser.add_argument("--keep", action="store_true", help="keep the generated log (and reuse it next time)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON too")
    args = parser.parse_args()

    log = args.dir / f"lmspec-bench-{args.size_mb}mb.log"
    if not (args.keep and log.is_file()):
        start = time.perf_counter()
        info = generate(log, args.size_mb * 1024 * 1024)
        print(
            f"generated {log}: {info['bytes'] / 1e6:,.0f} MB, {info['lines']:,} lines, "
            f"{info['steps']:,} steps in {time.perf_counter() - start:.0f} s"
        )
    size_mb = log.stat().st_size / 1e6
    env_note = f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}"
    commands = {
        "cat > /dev/null": ["sh", "-c", f"cat '{log}' > /dev/null"],
        "wc -l": ["wc", "-l", str(log)],
        "lmspec logs": _lmspec("logs", str(log), "--format", "json"),
        "lmspec doctor": _lmspec("doctor", str(log), "--format", "json"),
    }
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in commands}
    failed = False
    try:
        for _ in range(args.repeats):  # alternating, so a noisy neighbour hits every command alike
            for name, argv in commands.items():
                result = _measure(argv)
                if name == "lmspec doctor" and result["rc"] == 1:
                    result["rc"] = 0  # doctor exits 1 when it finds the problems the log holds
                if result["rc"] != 0:
                    print(f"{name} failed (exit {result['rc']}):\n{result['stderr']}", file=sys.stderr)
                    failed = True
                runs[name].append(result)
    finally:
        if not args.keep:
            log.unlink(missing_ok=True)
    if failed:
        return 2
    floor_s = statistics.median(r["wall_s"] for r in runs["cat > /dev/null"])
    figures = {}
    print(f"\n{size_mb:,.0f} MB log, {args.repeats} runs each, medians ({env_note}):")
    print(f"{'command':<16}{'wall s':>9}{'cpu s':>9}{'MB/s':>9}{'peak RSS MB':>13}{'x floor':>9}")
    for name, results in runs.items():
        wall = statistics.median(r["wall_s"] for r in results)
        cpu = statistics.median(r["cpu_s"] for r in results)
        rss_mb = statistics.median(r["peak_rss_kib"] for r in results) / 1024
        figures[name] = {
            "wall_s": wall,
            "cpu_s": cpu,
            "mb_per_s": size_mb / wall,
            "peak_rss_mb": rss_mb,
            "ratio_to_floor": wall / floor_s,
            "walls_s": [r["wall_s"] for r in results],
        }
        print(f"{name:<16}{wall:>9.2f}{cpu:>9.2f}{size_mb / wall:>9.1f}{rss_mb:>13.1f}{wall / floor_s:>9.1f}")
    if args.json:
        print(json.dumps({"size_mb": size_mb, "figures": figures}, indent=2))
    missed = [
        f"{name}: {figures[name]['mb_per_s']:.1f} MB/s < {TARGET_MB_PER_S:g}"
        for name in ("lmspec logs", "lmspec doctor")
        if figures[name]["mb_per_s"] < TARGET_MB_PER_S
    ]
    if size_mb >= 1000:  # the RSS target is stated for a 1 GB log
        missed += [
            f"{name}: peak RSS {figures[name]['peak_rss_mb']:.0f} MB > {TARGET_PEAK_RSS_MB:g}"
            for name in ("lmspec logs", "lmspec doctor")
            if figures[name]["peak_rss_mb"] > TARGET_PEAK_RSS_MB
        ]
    for line in missed:
        print(f"target missed: {line}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
