"""Runtime overhead: tokens/s of `python -m lmspec.runtime.train` on tiny vs a plain PyTorch loop.

    .venv/bin/python bench/train_overhead.py [ROUNDS]

Both sides run under torchrun with 2 ranks (DP=2, gloo) on this machine, in
alternating rounds of the same script, on the same megatron-core GPTModel (built
by lmspec.runtime.train.megatron.model), the same batches (lmspec.runtime.train.data over
lmspec.runtime.data.datasets) and the same batch shape (micro 4, global 16, seq 128, fp32).
The plain loop is what a person would write by hand: torch DDP, torch AdamW, clip_grad_norm_, one loss.backward() per
micro-batch. The runtime's number is its own metrics (step time from data fetch
to optimizer step, the same span the plain loop times). The first WARMUP_STEPS
steps of each run are left out. Prints both figures and their ratio (target >= 0.95).
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lmspec.compiler.plan import Plan
    from lmspec.compiler.spec.sections import Spec

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

STEPS = 20
WARMUP_STEPS = 4
DEFAULT_ROUNDS = 2
TIMEOUT_S = 600
OVERRIDES = [
    f"train.steps={STEPS}",
    "train.log_interval=1",
    f"train.checkpoint.interval={STEPS}",
    "train.checkpoint.resume=never",
    "train.eval_iters=0",  # no validation: the plain loop has none, and only training steps are timed
    "name=bench_overhead",
]


def _torchrun(args: list[str], cwd: Path) -> str:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node=2",
        "--master-addr=127.0.0.1",
        f"--master-port={29600 + os.getpid() % 300}",
        *args,
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        out, _ = proc.communicate(timeout=TIMEOUT_S)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed ({proc.returncode}):\n{out[-3000:]}")
    return out


def runtime_tokens_per_s(build: Path, cwd: Path) -> float:
    _torchrun(["-m", "lmspec.runtime.train", str(build)], cwd)
    lines = (cwd / "runs" / "bench_overhead" / "metrics.jsonl").read_text().splitlines()
    metrics = [json.loads(line) for line in lines][-(STEPS - WARMUP_STEPS) :]
    return sum(m["tokens_per_s"] * m["step_time_s"] for m in metrics) / sum(m["step_time_s"] for m in metrics)


def plain_tokens_per_s(build: Path, cwd: Path) -> float:
    out = _torchrun([str(Path(__file__).resolve()), "--plain", str(build)], cwd)
    return float(out.strip().splitlines()[-1].split()[-1])


def plain_worker(build: Path) -> None:
    """The hand-written loop (runs on each rank under torchrun)."""
    import torch.distributed as dist

    from lmspec.runtime.compat.megatron import megatron_on_cpu
    from lmspec.runtime.train.loop import load_build

    loaded = load_build(build)
    spec, plan = loaded.spec, loaded.plan
    dist.init_process_group("gloo")
    with megatron_on_cpu():
        _plain_loop(spec, plan)
    dist.destroy_process_group()


def _plain_loop(spec: Spec, plan: Plan) -> None:
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.core import tensor_parallel

    from lmspec.compiler.backends.megatron_config import ParallelDegrees, model_settings
    from lmspec.runtime.data.datasets import build_datasets
    from lmspec.runtime.train.data import micro_batches
    from lmspec.runtime.train.megatron.model import build_model

    batch = plan.trained().batch
    ps.initialize_model_parallel()
    torch.manual_seed(spec.train.seed)
    tensor_parallel.model_parallel_cuda_manual_seed(spec.train.seed)
    model = torch.nn.parallel.DistributedDataParallel(build_model(model_settings(spec, ParallelDegrees()), True, True))
    opt = spec.train.optimizer
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=opt.lr, betas=(opt.beta1, opt.beta2), eps=opt.eps, weight_decay=opt.weight_decay
    )
    micro, accum, s = batch.micro_batch_size, batch.grad_accum_steps, batch.seq_length
    train_data = build_datasets(spec, plan).train
    position_ids = torch.arange(s).unsqueeze(0).expand(micro, s)
    mask = torch.triu(torch.ones(1, 1, s, s, dtype=torch.bool), diagonal=1)
    rank, world = dist.get_rank(), dist.get_world_size()
    times = []
    for step in range(STEPS):
        started = time.perf_counter()
        batches = micro_batches(train_data, step * batch.global_batch_size, micro, rank, world, accum)
        optimizer.zero_grad(set_to_none=True)
        for i, b in enumerate(batches):
            context = model.no_sync() if i < accum - 1 else torch.enable_grad()
            with context:
                loss = model(b.tokens, position_ids, mask, labels=b.labels).float().mean() / accum
                loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), spec.train.grad_clip)
        optimizer.step()
        times.append(time.perf_counter() - started)
    steady = times[WARMUP_STEPS:]
    tokens_per_s = batch.tokens_per_step * len(steady) / sum(steady)
    if rank == 0:
        print(f"plain_tokens_per_s {tokens_per_s:.1f}", flush=True)


def main(rounds: int) -> None:
    from lmspec.compiler.build.writer import write_build
    from lmspec.compiler.emit.manifest import build_files
    from lmspec.compiler.pipeline import make_plan

    with tempfile.TemporaryDirectory(prefix="lmspec-bench-") as tmp:
        cwd = Path(tmp)
        build = cwd / "build" / "bench_overhead"
        write_build(build, build_files(make_plan(OVERRIDES)))
        runtime_runs, plain_runs = [], []
        for _ in range(rounds):
            runtime_runs.append(runtime_tokens_per_s(build, cwd))
            plain_runs.append(plain_tokens_per_s(build, cwd))
    rt, pl = max(runtime_runs), max(plain_runs)
    print(
        f"runtime (python -m lmspec.runtime.train): {rt:,.0f} tokens/s  "
        f"(rounds: {', '.join(f'{v:,.0f}' for v in runtime_runs)})"
    )
    print(
        f"plain PyTorch loop:                {pl:,.0f} tokens/s  (rounds: {', '.join(f'{v:,.0f}' for v in plain_runs)})"
    )
    print(
        f"ratio runtime / plain: {rt / pl:.3f} (target >= 0.95; best round of each, {STEPS - WARMUP_STEPS} "
        "steady steps, median ratio per round "
        f"{statistics.median(r / p for r, p in zip(runtime_runs, plain_runs)):.3f})"
    )


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--plain":
        plain_worker(Path(sys.argv[2]))
    else:
        main(int(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_ROUNDS)
