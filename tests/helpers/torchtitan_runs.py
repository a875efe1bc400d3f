"""Start helpers.torchtitan_worker under torchrun from a test and read what it trained.

Each run is its own process group (helpers.processes.run_in_group: killed on timeout); a test module keeps
the runs it shares (a reference trained once, compared by several tests) in a `Runs` cache.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from helpers.paths import ROOT
from helpers.ports import free_port
from helpers.processes import run_in_group

RUN_TIMEOUT_S = 180
# the built-in (tiny, CPU) spec at a micro-batch of one 32-token sample, 8 per step: gradient accumulation
# 8, 4 and 2 on 1, 2 and 4 ranks; the warm-up ends at step 1, so every step moves the weights at full rate
DENSE = (
    "train.micro_batch_size=1",
    "train.global_batch_size=8",
    "train.seq_length=32",
    "train.lr_schedule.warmup_steps=1",
)
MOE = ("model=tiny_moe", "train.micro_batch_size=1", "train.global_batch_size=4", "train.seq_length=32",
       "train.lr_schedule.warmup_steps=1")  # fmt: skip


@dataclass(frozen=True)
class Job:
    world: int
    overrides: tuple[str, ...] = DENSE
    replicate: int = 1  # HSDP's replicas; world / (replicate x tp) ranks shard each replica
    tp: int = 1  # tensor parallelism (with sequence parallelism, as torchtitan runs it) over consecutive ranks
    pp: int = 1  # pipeline stages (1F1B), the outermost mesh dimension
    virtual_stages: int | None = None  # stages per pipeline rank (Interleaved1F1B)
    activation_checkpoint: str = "none"
    first_step: int = 1
    last_step: int = 4
    save_after: int | None = None
    load: str | None = None  # a step directory an earlier Job saved (its Result.saved)
    init_from: str | None = None  # a step directory whose weights alone it starts from (train.init_from)


@dataclass(frozen=True)
class Result:
    losses: dict[int, float]
    grad_norms: dict[int, float]
    lrs: dict[int, float]
    eval_loss: float
    checkpointed: int  # decoder layers wrapped for activation checkpointing (full or per op)
    seconds: float  # the steps' wall time on rank 0
    saved: str | None  # the step directory it saved, if any


def train(job: Job, root: Path) -> Result:
    """Run `job` under torchrun in a fresh directory below `root`."""
    work = root / f"run-{len(list(root.glob('run-*')))}"
    work.mkdir(parents=True)
    doc = {**dataclasses.asdict(job), "checkpoints": str(work / "checkpoints"), "results": str(work / "result.json")}
    (work / "job.json").write_text(json.dumps(doc))
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]),
    }
    argv = [
        sys.executable,
        *("-m", "torch.distributed.run", f"--nproc-per-node={job.world}", "--max-restarts=0"),
        *("--master-addr=127.0.0.1", f"--master-port={free_port()}"),
        *("-m", "helpers.torchtitan_worker", str(work / "job.json")),
    ]
    done = run_in_group(argv, cwd=work, timeout_s=RUN_TIMEOUT_S, env=env, merge_stderr=True)
    assert done.returncode == 0, f"{job}: exit {done.returncode}\n{done.stdout[-4000:]}"
    raw = json.loads((work / "result.json").read_text())
    by_step = {key: {int(step): value for step, value in raw[key].items()} for key in ("losses", "grad_norms", "lrs")}
    saved = str(work / "checkpoints" / f"step_{job.save_after}") if job.save_after is not None else None
    return Result(
        **by_step, eval_loss=raw["eval_loss"], checkpointed=raw["checkpointed"], seconds=raw["seconds"], saved=saved
    )


class Runs:
    """Each Job trained once per test session directory, however many tests compare it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.done: dict[Job, Result] = {}

    def __call__(self, job: Job) -> Result:
        if job not in self.done:
            self.done[job] = train(job, self.root)
        return self.done[job]
