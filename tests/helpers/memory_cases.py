"""The layouts whose training-step memory is measured on CPU (helpers.step_memory) against the estimate.

One list for the test's sample and bench/memory_measured.py's full table: each case a name, its world
size and the overrides that make it from the built-in spec. Every backend the CPU target trains, each
sharding the estimate prices (ZeRO 0-3, TP with and without sequence parallelism, PP with and without
interleaving, EP), gradient accumulation 1 and 4, each recompute kind, dense and MoE, fp32 and bf16, and
micro-batches small enough that the optimizer step holds the peak.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from helpers.build import compile_build
from helpers.paths import ROOT
from helpers.ports import free_port
from helpers.processes import run_in_group
from lmspec.compiler.models.train_memory import StageMemory, estimate_train_memory
from lmspec.compiler.plan import Plan

RUN_TIMEOUT_S = 300


@dataclass(frozen=True)
class Case:
    name: str
    world: int
    overrides: tuple[str, ...]


def _case(name: str, world: int, *overrides: str) -> Case:
    return Case(name, world, (f"hardware.gpus_per_node={world}", *overrides))


MG, DS, TT = "train.backend=megatron", "train.backend=deepspeed", "train.backend=torchtitan"
# a micro-batch of 16 tokens: the activations are small beside the model state, so the gradient reduction or
# the optimizer step, not the backward, holds the step's peak
STEP = ("train.micro_batch_size=1", "train.seq_length=16")
TP2_SP = ("parallel.tp=2", "parallel.sequence_parallel=true")  # torchtitan runs TP with sequence parallelism only
CASES = (
    _case("megatron-ga1", 1, MG, "train.global_batch_size=4"),
    _case("megatron-ga4", 1, MG),
    _case("megatron-selective", 1, MG, "train.recompute=selective"),
    _case("megatron-full", 1, MG, "train.recompute=full"),
    _case("megatron-dp2", 2, MG),
    _case("megatron-tp2", 2, MG, "parallel.tp=2"),
    _case("megatron-tp2-sp", 2, MG, "parallel.tp=2", "parallel.sequence_parallel=true"),
    _case("megatron-pp2", 2, MG, "parallel.pp=2"),
    _case("megatron-pp2-vp2-dp2", 4, MG, "parallel.pp=2", "parallel.virtual_stages=2", "train.global_batch_size=32"),
    _case("megatron-tp2-pp2", 4, MG, "parallel.tp=2", "parallel.pp=2"),
    _case("megatron-moe", 1, MG, "model=tiny_moe"),
    _case("megatron-moe-ep2", 2, MG, "model=tiny_moe", "parallel.ep=2"),
    _case("deepspeed-zero0-ga1", 1, DS, "parallel.zero_stage=0", "train.global_batch_size=4"),
    _case("deepspeed-zero0-ga4", 1, DS, "parallel.zero_stage=0"),
    _case("deepspeed-zero1", 2, DS, "parallel.zero_stage=1"),
    _case("deepspeed-zero2", 2, DS, "parallel.zero_stage=2"),
    _case("deepspeed-zero3", 2, DS, "parallel.zero_stage=3"),
    _case("deepspeed-moe", 1, DS, "model=tiny_moe"),
    _case("megatron-step", 1, MG, *STEP, "train.global_batch_size=1"),
    _case("deepspeed-zero0-step", 1, DS, *STEP, "parallel.zero_stage=0", "train.global_batch_size=1"),
    _case("deepspeed-zero1-step-bf16", 2, DS, *STEP, "parallel.zero_stage=1", "train.precision=bf16"),
    _case("deepspeed-zero2-step", 2, DS, *STEP, "parallel.zero_stage=2", "train.global_batch_size=2"),
    _case("deepspeed-zero2-step-ga4", 2, DS, *STEP, "parallel.zero_stage=2", "train.global_batch_size=8"),
    _case("deepspeed-zero3-step-bf16", 2, DS, *STEP, "parallel.zero_stage=3", "train.precision=bf16"),
    _case("torchtitan-zero3", 2, TT, "parallel.zero_stage=3"),
    _case("torchtitan-zero2", 2, TT, "parallel.zero_stage=2"),
    _case("torchtitan-replicate", 2, TT, "parallel.zero_stage=0"),
    _case("torchtitan-zero3-full", 2, TT, "parallel.zero_stage=3", "train.recompute=full"),
    _case("torchtitan-zero3-op-ac", 2, TT, "parallel.zero_stage=3", "train.recompute=selective"),
    _case("torchtitan-tp2-op-ac", 2, TT, "parallel.zero_stage=3", "train.recompute=selective", *TP2_SP),
    _case("torchtitan-zero3-step", 2, TT, *STEP, "parallel.zero_stage=3", "train.global_batch_size=2"),
    _case("torchtitan-zero3-ga4-step", 2, TT, *STEP, "parallel.zero_stage=3", "train.global_batch_size=8"),
    _case("torchtitan-zero3-bf16", 2, TT, "parallel.zero_stage=3", "train.precision=bf16"),
    _case("torchtitan-zero3-dp4", 4, TT, "parallel.zero_stage=3"),
    _case("torchtitan-moe", 2, TT, "model=tiny_moe", "parallel.zero_stage=3"),
    _case("torchtitan-tp2", 2, TT, "parallel.zero_stage=3", *TP2_SP),
    _case("torchtitan-tp2-dp2", 4, TT, "parallel.zero_stage=3", *TP2_SP),
    _case("torchtitan-pp2", 2, TT, "parallel.pp=2"),
    _case("torchtitan-pp2-dp2", 4, TT, "parallel.pp=2", "parallel.zero_stage=3", "train.global_batch_size=16"),
)
BY_NAME = {c.name: c for c in CASES}


@dataclass(frozen=True)
class RankMemory:
    """One rank's measured step (helpers.step_memory) beside the estimate of its pipeline stage."""

    case: str
    rank: int
    measured: dict
    estimate: StageMemory

    @property
    def ratio(self) -> float:
        """Estimated allocated bytes over measured: at least 1 is an upper bound."""
        return self.estimate.allocated_bytes / self.measured["peak"]


def measure_case(case: Case, root: Path) -> list[RankMemory]:
    """Compile `case` under `root` and measure one training step on each of its ranks."""
    compiled = compile_build(root / case.name, case.overrides)
    out = root / case.name / "measured"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])}
    argv = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={case.world}",
            f"--master-port={free_port()}", "-m", "helpers.step_memory", str(out), str(compiled.dir)]  # fmt: skip
    result = run_in_group(argv, cwd=root, timeout_s=RUN_TIMEOUT_S, env=env, merge_stderr=True)
    if result.returncode != 0:
        raise RuntimeError(f"{case.name}: the measurement failed:\n{result.stdout[-4000:]}")
    measured = [json.loads(Path(f"{out}.{rank}").read_text()) for rank in range(case.world)]
    return [_rank(case, compiled.plan, rank, record) for rank, record in enumerate(measured)]


def _rank(case: Case, plan: Plan, rank: int, measured: dict) -> RankMemory:
    memory = estimate_train_memory(plan.trained().spec)
    assert memory is not None
    return RankMemory(case.name, rank, measured, memory.stages[measured["stage"]])
