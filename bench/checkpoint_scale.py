"""Checkpoint cost at 2 and 4 gloo ranks: lmspec's asynchronous save against megatron-core's own (issue 40).

    .venv/bin/python bench/checkpoint_scale.py [--gb 2] [--saves 5] [--ranks 2 4] [--dir DIR] [--json]

For each rank count N, N gloo ranks on this machine hold a synthetic model of `--gb` GiB (16 fp32 tensors,
replicated over data parallelism, so megatron-core's fully parallel strategy spreads the writing over the
ranks: each writes about 1/N of it). A training step is a fixed matmul loop, an in-place update of a 16 MiB
slice of the model (the pages the forked writer then shares copy-on-write) and a 1 MiB all-reduce standing
for the gradient one; the model itself is never rewritten, so the host memory stays N x GiB plus the
slices.

Two arms save the same state in the same run: one unmeasured save each first (the first save of a
process pays one-off costs), then `--saves` each, alternating (M L, then L M, ...):
  megatron  dist_checkpointing.save(async_sharded_save=True) with FullyParallelSaveStrategyWrapper, the
            request run by megatron-core's AsyncCallsQueue(persistent=False), maybe_finalize_async_calls
            (blocking=False) after every step until it is finalized: no lmspec code; megatron-core keeps
            every checkpoint, so the bench deletes the previous one after the window, unmeasured;
  lmspec    Checkpoints + Saver(asynchronous=True) over a trainer whose save() is the Megatron trainer's
            (the same call, the request wrapped by Digests), Saver.poll() after every step until committed;
            keep_last_k=1, so the commit's pruning of the previous step counts, as it does in a run.

Figures, per save (medians over the saves, means over the ranks):
  lost      training time lost: wall time from the save call to the step in which it is finalized,
            minus as many steps at the step time measured without a save in flight (same run);
            target lmspec / megatron <= 1.1.
  own      a rank's save and poll calls less the time it waited in collectives (torch.distributed's
            collectives are timed): its own work on the training critical path.
  rank work own plus its writer's persist (the forked writer's run time); target rank 0 <= 1.1 x the mean
            of the others (a rank-0 pass over the checkpoint would show here).
  resume    Checkpoints.open_run("auto") (each rank digests its share of the files) and
            dist_checkpointing.load of the state as lmspec's trainer does it, page cache dropped first
            (posix_fadvise DONTNEED, the files being fsynced). The state being replicated, every rank
            reads all of it: megatron-core's FullyParallelLoadStrategyWrapper, which would split the
            reading, moves tensors with .cuda() and cannot run on a CPU.
Also the digest throughput of one core (xxh3_128, sha256, blake3 single-threaded) over 512 MiB in memory.
Targets are reported, not asserted; the exit code is 0 unless a rank fails. A save not finalized in
SAVE_TIMEOUT_S stops the run: once in ~50 saves on this 2-core machine a writer forked by megatron-core's
AsyncCallsQueue hung in CPython 3.11's after-fork cleanup (PyOS_AfterFork_Child waiting on the
thread-state lock; the parent has gloo/c10d threads), in the megatron arm as well.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import socket
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TENSORS = 16
HOT_ELEMENTS = 4 << 20  # 16 MiB of fp32 changed in place each step
GRAD_ELEMENTS = 256 << 10  # 1 MiB all-reduced each step
MATMUL = 256
MATMUL_REPEATS = 24
WARMUP_STEPS = 5
BASELINE_STEPS = 20
COOLDOWN_STEPS = 8  # between saves; their times join the baseline
SAVE_TIMEOUT_S = 300  # a save not finalized by then is stuck (module docstring): the run stops
DIGEST_BYTES = 512 << 20
RATIO_TARGET = 1.1
RANK0_TARGET = 0.10
COLLECTIVES = (
    "barrier",
    "all_reduce",
    "all_gather",
    "all_gather_object",
    "broadcast",
    "broadcast_object_list",
    "gather",
    "gather_object",
    "scatter_object_list",
    "reduce",
)


def digest_throughput() -> dict[str, float]:
    """GB/s of one core, best of three over DIGEST_BYTES in memory."""
    import blake3
    import xxhash

    data = os.urandom(64 << 20) * (DIGEST_BYTES // (64 << 20))
    makers: dict[str, Any] = {
        "xxh3_128 (xxhash)": xxhash.xxh3_128,
        "sha256 (hashlib)": hashlib.sha256,
        "blake3 (max_threads=1)": lambda: blake3.blake3(max_threads=1),
    }
    found = {}
    for name, make in makers.items():
        best = float("inf")
        for _ in range(3):
            started = time.perf_counter()
            hasher = make()
            hasher.update(data)
            hasher.digest()
            best = min(best, time.perf_counter() - started)
        found[name] = len(data) / best / 1e9
    return found


@dataclass
class Settings:
    gb: float
    saves: int
    workdir: Path
    port: int


@dataclass
class RankResult:
    rank: int
    step_s: float  # median step time without a save in flight
    lost_s: dict[str, list[float]] = field(default_factory=dict)  # arm -> per save
    work_s: dict[str, list[float]] = field(default_factory=dict)  # arm -> per save: own time + persist
    persist_s: dict[str, list[float]] = field(default_factory=dict)
    own_s: dict[str, list[float]] = field(default_factory=dict)  # save and poll calls less collective waits
    wall_s: dict[str, list[float]] = field(default_factory=dict)  # save call to finalized
    steps: dict[str, list[float]] = field(default_factory=dict)  # steps in that window
    written_bytes: int = 0
    verify_s: float = 0.0
    load_s: float = 0.0
    rss_gib: float = 0.0
    min_available_gib: float = 0.0


class CollectiveClock:
    """Time spent inside torch.distributed collectives (outermost calls) while `on`."""

    def __init__(self) -> None:
        import torch.distributed as dist

        self.total = 0.0
        self.depth = 0
        for name in COLLECTIVES:
            setattr(dist, name, self._timed(getattr(dist, name)))

    def _timed(self, fn: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            self.depth += 1
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.depth -= 1
                if self.depth == 0:
                    self.total += time.perf_counter() - started

        return call

    def own(self, fn: Any) -> float:
        """Run `fn`: the seconds it took less those it spent in collectives."""
        waited, started = self.total, time.perf_counter()
        fn()
        return time.perf_counter() - started - (self.total - waited)


def _run_timed(record: Path, fn: Any, *args: Any, **kwargs: Any) -> None:
    """A request's writer (in the forked process): runs it and records its duration."""
    started = time.perf_counter()
    fn(*args, **kwargs)
    record.write_text(f"{time.perf_counter() - started}\n")


def _timed_request(request: Any, record: Path) -> Any:
    return request._replace(async_fn=partial(_run_timed, record, request.async_fn))


class SyntheticModel:
    def __init__(self, gib: float, rank: int) -> None:
        import torch

        numel = int(gib * (1 << 30)) // 4 // TENSORS
        self.rank = rank
        self.tensors = [torch.arange(numel, dtype=torch.float32).mul_(1e-9).add_(i) for i in range(TENSORS)]
        self.hot = self.tensors[0][:HOT_ELEMENTS]
        self.a = torch.randn(MATMUL, MATMUL)
        self.b = torch.randn(MATMUL, MATMUL)
        self.out = torch.empty(MATMUL, MATMUL)
        self.grad = torch.ones(GRAD_ELEMENTS)

    def step(self) -> None:
        import torch
        import torch.distributed as dist

        for _ in range(MATMUL_REPEATS):
            torch.mm(self.a, self.b, out=self.out)
        self.hot.add_(1e-6)
        dist.all_reduce(self.grad)

    def sharded_state(self) -> dict[str, Any]:
        from megatron.core.dist_checkpointing import ShardedTensor

        return {
            f"layer{i}": ShardedTensor.from_rank_offsets(f"decoder.layers.{i}.weight", t, replica_id=self.rank)
            for i, t in enumerate(self.tensors)
        }


def _save_strategy() -> Any:
    import torch.distributed as dist
    from megatron.core.dist_checkpointing.serialization import get_default_save_sharded_strategy
    from megatron.core.dist_checkpointing.strategies.fully_parallel import FullyParallelSaveStrategyWrapper

    return FullyParallelSaveStrategyWrapper(
        get_default_save_sharded_strategy(), dist.group.WORLD, do_cache_distribution=True
    )


class SyntheticTrainer:
    """lmspec's MegatronTrainer.save over the synthetic state."""

    def __init__(self, model: SyntheticModel, records: Path) -> None:
        self.model = model
        self.strategy = _save_strategy()
        self.records = records
        self.saves = 0

    def save(self, directory: Path) -> Any:
        import torch.distributed as dist
        from megatron.core import dist_checkpointing

        from lmspec.compiler.build.files import DIST_CKPT_DIR
        from lmspec.runtime.train.megatron.digested_save import Digests
        from lmspec.runtime.train.saving import Staged

        target = directory / DIST_CKPT_DIR
        if dist.get_rank() == 0:
            target.mkdir()
        dist.barrier()
        request = dist_checkpointing.save(
            self.model.sharded_state(), str(target), sharded_strategy=self.strategy, async_sharded_save=True
        )
        digests = Digests(directory)
        self.saves += 1
        record = self.records / f"lmspec_{dist.get_rank()}_{self.saves}"
        return Staged(_timed_request(digests.wrap(request), record), digests)


class MegatronArm:
    name = "megatron"

    def __init__(self, model: SyntheticModel, root: Path, records: Path) -> None:
        from megatron.core.dist_checkpointing.strategies.async_utils import AsyncCallsQueue

        self.model = model
        self.root = root
        self.records = records
        self.strategy = _save_strategy()
        self.queue = AsyncCallsQueue(persistent=False)
        self.saves = 0

    def save(self, step: int) -> None:
        import torch.distributed as dist
        from megatron.core import dist_checkpointing

        target = self.root / f"iter_{step:07d}"
        if dist.get_rank() == 0:
            target.mkdir(parents=True)
        dist.barrier()
        request = dist_checkpointing.save(
            self.model.sharded_state(), str(target), sharded_strategy=self.strategy, async_sharded_save=True
        )
        self.saves += 1
        record = self.records / f"megatron_{dist.get_rank()}_{self.saves}"
        self.queue.schedule_async_request(_timed_request(request, record))

    def prune(self) -> None:
        """The previous checkpoint deleted, outside the measured window (megatron-core keeps every one)."""
        import torch.distributed as dist

        if dist.get_rank() == 0:
            for old in sorted(self.root.glob("iter_*"))[:-1]:
                shutil.rmtree(old)
        dist.barrier()

    def poll(self) -> None:
        if self.queue.get_num_unfinalized_calls():
            self.queue.maybe_finalize_async_calls(blocking=False)

    def done(self) -> bool:
        return not self.queue.get_num_unfinalized_calls()


class LmspecArm:
    name = "lmspec"

    def __init__(self, model: SyntheticModel, root: Path, records: Path) -> None:
        from lmspec.runtime.train.checkpoint import Checkpoints
        from lmspec.runtime.train.saving import Saver

        self.trainer = SyntheticTrainer(model, records)
        self.ckpts = Checkpoints(root, keep_last_k=1)
        self.ckpts.open_run("never")
        self.saver = Saver(self.ckpts, self.trainer, asynchronous=True)

    def save(self, step: int) -> None:
        import torch

        self.saver.save(step, {"step": step, "consumed_samples": step * 1024, "rng": torch.get_rng_state()})

    def prune(self) -> None:
        """Nothing: Checkpoints.commit prunes to keep_last_k itself, inside the window."""

    def poll(self) -> None:
        self.saver.poll()

    @property
    def queue(self) -> Any:
        return self.saver.queue

    def done(self) -> bool:
        return not self.queue.get_num_unfinalized_calls()


def _available_gib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / (1 << 20)
    return float("nan")


def _rss_gib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / (1 << 20)
    return float("nan")


def _drop_cache(root: Path) -> None:
    """Every fsynced file under `root` out of the page cache (rank 0; then all ranks wait)."""
    import torch.distributed as dist

    if dist.get_rank() == 0:
        for path in root.rglob("*"):
            if path.is_file():
                fd = os.open(path, os.O_RDONLY)
                try:
                    os.fdatasync(fd)
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)
    dist.barrier()


def _measure(rank: int, settings: Settings) -> RankResult:
    import torch.distributed as dist

    records = settings.workdir / "records"
    model = SyntheticModel(settings.gb, rank)
    arms: list[Any] = [
        MegatronArm(model, settings.workdir / "megatron", records),
        LmspecArm(model, settings.workdir / "lmspec", records),
    ]
    clock = CollectiveClock()
    min_available = _available_gib()
    for _ in range(WARMUP_STEPS):
        model.step()
    step_times = []

    def steps(count: int) -> None:
        for _ in range(count):
            started = time.perf_counter()
            model.step()
            step_times.append(time.perf_counter() - started)

    def window(arm: Any, step: int) -> tuple[float, int, float]:
        """One save from the call to the step it is finalized in: (wall, steps, own time of its calls)."""
        nonlocal min_available
        dist.barrier()
        started = time.perf_counter()
        own = clock.own(partial(arm.save, step))
        count = 0
        queue = arm.queue
        (records / f"writer_{rank}").write_text(f"{queue.async_calls[-1].async_caller.process.pid}\n")
        while not arm.done():
            model.step()
            own += clock.own(arm.poll)
            count += 1
            min_available = min(min_available, _available_gib())
            if time.perf_counter() - started > SAVE_TIMEOUT_S:
                for call in queue.async_calls:
                    call.async_caller.close(abort=True)
                raise RuntimeError(
                    f"rank {rank}: the {arm.name} save of step {step} was not finalized in {SAVE_TIMEOUT_S} s; "
                    "its forked writer is stuck (see the module docstring); rerun"
                )
        return time.perf_counter() - started, count, own

    for step, arm in enumerate(arms, start=1):  # the first save of each arm pays one-off costs: not counted
        window(arm, step)
        arm.prune()
    steps(BASELINE_STEPS)
    windows: dict[str, list[tuple[float, int, float]]] = {arm.name: [] for arm in arms}
    step = len(arms)
    for i in range(settings.saves):
        for arm in arms if i % 2 == 0 else arms[::-1]:
            steps(COOLDOWN_STEPS)
            step += 1
            windows[arm.name].append(window(arm, step))
            arm.prune()
    step_s = statistics.median(step_times)
    result = RankResult(rank=rank, step_s=step_s, min_available_gib=min_available, rss_gib=_rss_gib())
    for name, runs in windows.items():
        persists = [float((records / f"{name}_{rank}_{n + 2}").read_text()) for n in range(len(runs))]
        result.persist_s[name] = persists
        result.lost_s[name] = [wall - count * step_s for wall, count, _ in runs]
        result.work_s[name] = [own + persist for (_, _, own), persist in zip(runs, persists, strict=True)]
        result.own_s[name] = [own for _, _, own in runs]
        result.wall_s[name] = [wall for wall, _, _ in runs]
        result.steps[name] = [float(count) for _, count, _ in runs]
    _resume(arms[1], model, result)
    return result


def _resume(arm: LmspecArm, model: SyntheticModel, result: RankResult) -> None:
    from megatron.core import dist_checkpointing

    from lmspec.compiler.build.files import DIST_CKPT_DIR
    from lmspec.runtime.train.checkpoint import Checkpoints

    root = arm.ckpts.root
    committed = arm.saver.committed
    assert committed is not None
    result.written_bytes = sum(p.stat().st_size for p in (committed / DIST_CKPT_DIR).glob(f"__{result.rank}_*.distcp"))
    _drop_cache(root)
    started = time.perf_counter()
    found = Checkpoints(root, keep_last_k=1).open_run("auto")
    result.verify_s = time.perf_counter() - started
    assert found == committed, (found, committed)
    target = str(found / DIST_CKPT_DIR)
    _drop_cache(root)
    started = time.perf_counter()
    dist_checkpointing.load(model.sharded_state(), target)
    result.load_s = time.perf_counter() - started


def _rank_main(rank: int, world: int, settings: Settings) -> None:
    import warnings

    warnings.filterwarnings("ignore", message=".*Transformer Engine and Apex.*")
    import torch
    import torch.distributed as dist

    from lmspec.runtime.compat.megatron import megatron_on_cpu

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{settings.port}", rank=rank, world_size=world)
    try:
        with megatron_on_cpu():
            result = _measure(rank, settings)
        (settings.workdir / f"result_{rank}.json").write_text(json.dumps(asdict(result)))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _kill_writers(records: Path) -> None:
    """The ranks' last background writers that outlived their rank (a failed run): still in this process
    group, so not a process that took a finished writer's pid since."""
    for path in records.glob("writer_*"):
        pid = int(path.read_text())
        try:
            if os.getpgid(pid) == os.getpgrp():
                os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def run_ranks(world: int, gb: float, saves: int, base: Path) -> list[RankResult]:
    import torch.multiprocessing as mp

    workdir = Path(tempfile.mkdtemp(prefix=f"checkpoint-scale-{world}-", dir=base))
    try:
        (workdir / "records").mkdir()
        settings = Settings(gb=gb, saves=saves, workdir=workdir, port=_free_port())
        try:
            mp.spawn(_rank_main, args=(world, settings), nprocs=world, join=True)
        except BaseException:
            _kill_writers(workdir / "records")
            raise
        results = []
        for rank in range(world):
            doc = json.loads((workdir / f"result_{rank}.json").read_text())
            results.append(RankResult(**doc))
        return results
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


@dataclass
class Summary:
    ranks: int
    step_ms: float
    lost_s: dict[str, float]  # arm -> median over saves of the mean over ranks
    ratio: float
    rank0_work_s: dict[str, float]
    others_work_s: dict[str, float]
    rank0_own_s: dict[str, float]  # arm -> the save and poll calls less collective waits: the critical path
    others_own_s: dict[str, float]
    rank0_extra: dict[str, float]  # arm -> rank 0's work / the others' mean - 1
    written_gb_per_rank: float
    verify_s: float  # mean over ranks
    load_s: float
    min_available_gib: float
    rss_gib: float
    saves: dict[str, dict[str, list[float]]]  # arm -> figure -> per save, mean over ranks (for --json)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def summarise(results: list[RankResult]) -> Summary:
    arms = list(results[0].lost_s)
    saves = len(results[0].lost_s[arms[0]])

    def per_save(attr: str, arm: str, ranks: list[RankResult]) -> float:
        return statistics.median(_mean([getattr(r, attr)[arm][i] for r in ranks]) for i in range(saves))

    lost = {arm: per_save("lost_s", arm, results) for arm in arms}
    rank0 = {arm: per_save("work_s", arm, results[:1]) for arm in arms}
    others = {arm: per_save("work_s", arm, results[1:]) for arm in arms}
    return Summary(
        ranks=len(results),
        step_ms=1000 * _mean([r.step_s for r in results]),
        lost_s=lost,
        ratio=lost["lmspec"] / lost["megatron"],
        rank0_work_s=rank0,
        others_work_s=others,
        rank0_own_s={arm: per_save("own_s", arm, results[:1]) for arm in arms},
        others_own_s={arm: per_save("own_s", arm, results[1:]) for arm in arms},
        rank0_extra={arm: rank0[arm] / others[arm] - 1 for arm in arms},
        written_gb_per_rank=_mean([r.written_bytes for r in results]) / 1e9,
        verify_s=_mean([r.verify_s for r in results]),
        load_s=_mean([r.load_s for r in results]),
        min_available_gib=min(r.min_available_gib for r in results),
        rss_gib=max(r.rss_gib for r in results),
        saves={
            arm: {
                attr: [_mean([getattr(r, attr)[arm][i] for r in results]) for i in range(saves)]
                for attr in ("lost_s", "work_s", "persist_s", "own_s", "wall_s", "steps")
            }
            for arm in arms
        },
    )


def _verdict(ok: bool) -> str:
    return "meets" if ok else "MISSES"


def report(gb: float, saves: int, digests: dict[str, float], summaries: list[Summary]) -> str:
    lines = [f"digest throughput, one core, {DIGEST_BYTES >> 20} MiB in memory:"]
    lines += [f"  {name:<24} {rate:6.2f} GB/s" for name, rate in digests.items()]
    lines.append("")
    lines.append(
        f"synthetic model {gb:g} GiB ({gb * (1 << 30) / 1e9:.2f} GB, {TENSORS} fp32 tensors replicated over DP), "
        f"{saves} saves per arm alternating; lost = time lost per save (median)"
    )
    header = (
        f"{'ranks':>5} {'step ms':>8} {'lost megatron s':>16} {'lost lmspec s':>14} {'ratio':>6}  "
        f"{'rank0 work s':>12} {'others s':>9} {'rank0 extra':>11}  {'GB written/rank':>15}  "
        f"{'verify s':>8} {'load s':>7} {'resume s':>8}"
    )
    lines.append(header)
    for s in summaries:
        lines.append(
            f"{s.ranks:>5} {s.step_ms:>8.1f} {s.lost_s['megatron']:>16.2f} {s.lost_s['lmspec']:>14.2f} "
            f"{s.ratio:>6.2f}  {s.rank0_work_s['lmspec']:>12.2f} {s.others_work_s['lmspec']:>9.2f} "
            f"{s.rank0_extra['lmspec']:>+10.1%}  {s.written_gb_per_rank:>15.2f}  {s.verify_s:>8.2f} "
            f"{s.load_s:>7.2f} {s.verify_s + s.load_s:>8.2f}"
        )
    lines.append("")
    lines.append("per save (mean over ranks), in the order run; own = save/poll calls less collective waits:")
    for s in summaries:
        for arm, figures in s.saves.items():
            lost = " ".join(f"{v:5.2f}" for v in figures["lost_s"])
            persist = " ".join(f"{v:5.2f}" for v in figures["persist_s"])
            lines.append(
                f"  {s.ranks} ranks {arm:<8} lost s [{lost}]  persist s [{persist}]  own s rank 0 "
                f"{s.rank0_own_s[arm]:.2f}, others {s.others_own_s[arm]:.2f}"
            )
    lines.append("")
    for s in summaries:
        lines.append(
            f"{s.ranks} ranks: lmspec/megatron lost time {s.ratio:.2f} (target <= {RATIO_TARGET}: "
            f"{_verdict(s.ratio <= RATIO_TARGET)}); rank 0's save work {s.rank0_extra['lmspec']:+.1%} of the "
            f"others' (target <= {RANK0_TARGET:.0%}: {_verdict(s.rank0_extra['lmspec'] <= RANK0_TARGET)}; "
            f"megatron alone {s.rank0_extra['megatron']:+.1%}); peak RSS/rank {s.rss_gib:.1f} GiB, "
            f"min MemAvailable {s.min_available_gib:.1f} GiB"
        )
    if len(summaries) > 1:
        first, last = summaries[0], summaries[-1]
        falling = last.written_gb_per_rank < first.written_gb_per_rank and last.verify_s < first.verify_s
        lines.append(
            f"per-rank cost {first.ranks} -> {last.ranks} ranks: written {first.written_gb_per_rank:.2f} -> "
            f"{last.written_gb_per_rank:.2f} GB, verify {first.verify_s:.2f} -> {last.verify_s:.2f} s "
            f"({'falling' if falling else 'NOT falling'})"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gb", type=float, default=2.0, help="model size in GiB (default 2)")
    parser.add_argument("--saves", type=int, default=5, help="measured saves per arm (default 5)")
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4], help="rank counts (default 2 4)")
    parser.add_argument("--dir", type=Path, default=None, help="scratch directory (default: the system temp)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON after the table")
    args = parser.parse_args(argv)
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    base = args.dir or Path(tempfile.gettempdir())
    base.mkdir(parents=True, exist_ok=True)
    digests = digest_throughput()
    summaries = []
    for world in args.ranks:
        started = time.perf_counter()
        summaries.append(summarise(run_ranks(world, args.gb, args.saves, base)))
        print(f"{world} ranks measured in {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    print(report(args.gb, args.saves, digests, summaries))
    if args.json:
        print(json.dumps({"digest_gb_per_s": digests, "runs": [asdict(s) for s in summaries]}, indent=2))


if __name__ == "__main__":
    main()
