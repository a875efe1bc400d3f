"""Does `lmspec data prepare` keep up with its tokenizer, in bounded memory? Tokens/s and peak RSS on generated jsonl.

Generates two jsonl corpora (default >= 100 MB and 2x that: documents of 1-6 paragraphs of the
shipped corpus with numbers mixed in) and a byte-level BPE trained offline on the shipped
corpus (tests/helpers/tokenizers.py), then alternates, in fresh processes as a user runs them:

- `lmspec data prepare CORPUS --workers 2 --append-eod` (Megatron .bin/.idx and the sidecar);
- the floor (at the smaller size; --floor-at-both for both): one process that reads and
  json-parses the same file, calls the same tokenizer's `encode_batch` (lmspec.runtime.data.
  tokenizer, rayon threads on every core) on batches of the same size, appends the eod and
  writes the same token ids with numpy: no Megatron files. Its output is compared byte for
  byte with PREFIX.bin, so both did the same work.

Both are timed wall-clock from process start (imports included: what a user waits for).
Memory is the whole process tree's, sampled every 20 ms from /proc: the sum of RSS over the
processes (counts pages shared between them once per process: an upper bound) and the sum of
PSS (shared pages split between their users: what the tree occupies). Targets (issue 16):
prepare >= 0.8x the floor's tokens/s, peak RSS <= 500 MB at both sizes. Checked here, never as
timed asserts in tests.

    .venv/bin/python bench/data_prepare.py [--size-mb 100] [--repeats 1] [--dir /tmp] [--floor-at-both] [--json]

Exit 1 when a target is missed; a failing command stops it with its stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # helpers.tokenizers: the offline BPE the tests use

from helpers.tokenizers import builtin_documents, train_bpe_tokenizer  # noqa: E402

TARGET_RATIO = 0.8
TARGET_PEAK_RSS_MB = 500.0
WORKERS = 2
LMSPEC = "from lmspec.compiler.cli.main import main; main()"  # what the `lmspec` console script runs
# The floor: read + json-parse + encode_batch + numpy write, in prepare's batches (readers.BATCH_*).
_FLOOR = """
import json, sys
from pathlib import Path
import numpy as np
from lmspec.runtime.data.readers import BATCH_BYTES, BATCH_DOCUMENTS
from lmspec.runtime.data.tokenizer import load_tokenizer
tokenizer = load_tokenizer(Path(sys.argv[1]))
dtype = np.uint16 if tokenizer.files.vocab_size < 65500 else np.int32
tokens = 0
def write(texts, out):
    global tokens
    for ids in tokenizer.encode_batch(texts):
        ids.append(tokenizer.eod_id)
        np.array(ids, dtype=dtype).tofile(out)
        tokens += len(ids)
with open(sys.argv[2], "rb") as source, open(sys.argv[3], "wb") as out:
    texts, size = [], 0
    for line in source:
        texts.append(json.loads(line)["text"])
        size += len(line)
        if len(texts) == BATCH_DOCUMENTS or size >= BATCH_BYTES:
            write(texts, out)
            texts, size = [], 0
    write(texts, out)
print(tokens)
"""


def generate(path: Path, size_bytes: int, seed: int = 16) -> int:
    """A jsonl of at least `size_bytes`; returns its document count."""
    rng = random.Random(seed)
    paragraphs = builtin_documents()
    documents = 0
    written = 0
    with path.open("w", encoding="utf-8") as out:
        while written < size_bytes:
            block = []
            for _ in range(1000):
                parts = rng.sample(paragraphs, rng.randint(1, 6))
                text = "\n\n".join(f"{p} ({rng.randrange(10**6)})" for p in parts)
                block.append(json.dumps({"id": documents, "text": text}) + "\n")
                documents += 1
            data = "".join(block)
            out.write(data)
            written += len(data.encode("utf-8"))
    return documents


def _tree(root: int) -> list[int]:
    """`root` and its descendants, from /proc's parent ids."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def _memory_kib(pid: int) -> tuple[int, int]:
    """(RSS, PSS) of one process in KiB; zeros once it has gone."""
    try:
        rss = int(Path(f"/proc/{pid}/status").read_text().split("VmRSS:")[1].split()[0])
        rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
        pss = int(rollup.split("\nPss:")[1].split()[0])
    except (OSError, IndexError):
        return 0, 0
    return rss, pss


def measure(argv: list[str]) -> dict[str, float | int | str]:
    """Run `argv`; its wall time, exit code, stdout and the peak summed RSS and PSS of its process tree."""
    peaks = {"rss": 0, "pss": 0, "processes": 0}
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def sample() -> None:
        while proc.poll() is None:
            pids = _tree(proc.pid)
            sums = [sum(column) for column in zip(*(_memory_kib(pid) for pid in pids))]
            if sums:
                peaks["rss"] = max(peaks["rss"], sums[0])
                peaks["pss"] = max(peaks["pss"], sums[1])
                peaks["processes"] = max(peaks["processes"], len(pids))
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = proc.communicate()
    wall = time.perf_counter() - start
    sampler.join()
    return {
        "rc": proc.returncode,
        "wall_s": wall,
        "stdout": out,
        "stderr": err[-2000:],
        "peak_rss_mb": peaks["rss"] / 1024,
        "peak_pss_mb": peaks["pss"] / 1024,
        "processes": peaks["processes"],
    }


def run_size(workdir: Path, tokenizer: Path, size_mb: int, repeats: int, floor: bool) -> dict[str, float | int]:
    """Prepare a generated corpus of `size_mb` (alternating with the floor when `floor`); the figures."""
    corpus = workdir / f"corpus-{size_mb}mb.jsonl"
    start = time.perf_counter()
    documents = generate(corpus, size_mb * 10**6)
    mb = corpus.stat().st_size / 1e6
    print(f"generated {corpus.name}: {mb:,.0f} MB, {documents:,} documents in {time.perf_counter() - start:.0f} s")
    prepares, floors = [], []
    tokens = 0
    for repeat in range(repeats):  # alternating, so a noisy neighbour hits both alike
        prefix = workdir / f"prepared-{size_mb}-{repeat}"
        floor_out = workdir / f"floor-{size_mb}-{repeat}.bin"
        prepare = measure(
            [sys.executable, "-c", LMSPEC, "data", "prepare", str(corpus), "--tokenizer", str(tokenizer)]
            + ["--output", str(prefix), "--workers", str(WORKERS), "--append-eod"]
        )
        if prepare["rc"] != 0:
            raise SystemExit(f"lmspec data prepare failed (exit {prepare['rc']}):\n{prepare['stderr']}")
        tokens = json.loads((workdir / f"{prefix.name}.lmspec.json").read_text())["tokens"]
        prepares.append(prepare)
        if floor:
            result = measure([sys.executable, "-c", _FLOOR, str(tokenizer), str(corpus), str(floor_out)])
            if result["rc"] != 0:
                raise SystemExit(f"the floor failed (exit {result['rc']}):\n{result['stderr']}")
            if int(str(result["stdout"]).strip()) != tokens or not _same_file(
                floor_out, workdir / f"{prefix.name}.bin"
            ):
                raise SystemExit(f"{prefix}.bin and the floor's {floor_out} hold different token ids")
            floor_out.unlink()
            floors.append(result)
        for suffix in (".bin", ".idx", ".lmspec.json"):
            (workdir / f"{prefix.name}{suffix}").unlink()
    corpus.unlink()
    prepare_s = statistics.median(float(r["wall_s"]) for r in prepares)
    figures: dict[str, float | int] = {
        "size_mb": mb,
        "documents": documents,
        "tokens": tokens,
        "prepare_s": prepare_s,
        "prepare_tokens_per_s": tokens / prepare_s,
        "prepare_peak_rss_mb": max(float(r["peak_rss_mb"]) for r in prepares),
        "prepare_peak_pss_mb": max(float(r["peak_pss_mb"]) for r in prepares),
        "prepare_processes": max(int(r["processes"]) for r in prepares),
    }
    if floors:
        floor_s = statistics.median(float(r["wall_s"]) for r in floors)
        figures |= {
            "floor_s": floor_s,
            "floor_tokens_per_s": tokens / floor_s,
            "ratio": floor_s / prepare_s,
            "floor_peak_rss_mb": max(float(r["peak_rss_mb"]) for r in floors),
        }
    return figures


def _same_file(a: Path, b: Path) -> bool:
    if a.stat().st_size != b.stat().st_size:
        return False
    with a.open("rb") as fa, b.open("rb") as fb:
        while chunk := fa.read(2**20):
            if chunk != fb.read(2**20):
                return False
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=int, default=100, help="the smaller corpus; the larger is 2x (default 100)")
    parser.add_argument("--repeats", type=int, default=1, help="runs of each command per size (medians reported)")
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()), help="where to work (/tmp)")
    parser.add_argument("--floor-at-both", action="store_true", help="measure the floor at the larger size too")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON too")
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="lmspec-bench-prepare-", dir=args.dir))
    env_note = f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}"
    try:
        tokenizer = train_bpe_tokenizer(workdir / "tokenizer")
        figures = [
            run_size(workdir, tokenizer, args.size_mb, args.repeats, floor=True),
            run_size(workdir, tokenizer, 2 * args.size_mb, args.repeats, floor=args.floor_at_both),
        ]
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"\nlmspec data prepare --workers {WORKERS} vs the encode_batch floor, {args.repeats} run(s) ({env_note}):")
    print(
        f"{'MB':>6}{'documents':>11}{'tokens':>13}{'prepare s':>11}{'floor s':>9}{'prepare tok/s':>15}"
        f"{'floor tok/s':>13}{'x floor':>9}{'RSS MB':>8}{'PSS MB':>8}"
    )
    for f in figures:
        floor = (
            f"{f['floor_s']:>9.1f}{f['prepare_tokens_per_s']:>15,.0f}{f['floor_tokens_per_s']:>13,.0f}{f['ratio']:>9.2f}"
            if "ratio" in f
            else f"{'-':>9}{f['prepare_tokens_per_s']:>15,.0f}{'-':>13}{'-':>9}"
        )
        print(
            f"{f['size_mb']:>6.0f}{f['documents']:>11,}{f['tokens']:>13,}{f['prepare_s']:>11.1f}{floor}"
            f"{f['prepare_peak_rss_mb']:>8.0f}{f['prepare_peak_pss_mb']:>8.0f}"
        )
    print(
        f"(RSS/PSS: peak sums over the prepare tree of {figures[0]['prepare_processes']} processes; "
        f"the floor's single process peaked at {figures[0]['floor_peak_rss_mb']:.0f} MB RSS)"
    )
    if args.json:
        print(json.dumps({"workers": WORKERS, "figures": figures}, indent=2))
    missed = [
        f"{f['size_mb']:.0f} MB: {f['ratio']:.2f}x < {TARGET_RATIO}x"
        for f in figures
        if f.get("ratio", 1.0) < TARGET_RATIO
    ]
    missed += [
        f"{f['size_mb']:.0f} MB: peak RSS {f['prepare_peak_rss_mb']:.0f} MB > {TARGET_PEAK_RSS_MB:.0f} MB"
        for f in figures
        if f["prepare_peak_rss_mb"] > TARGET_PEAK_RSS_MB
    ]
    for line in missed:
        print(f"target missed: {line}", file=sys.stderr)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
