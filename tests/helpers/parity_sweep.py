"""The parity sweep: compile layouts, train each 3 steps, compare its losses with the single-rank reference.

    PYTHONPATH=tests .venv/bin/python -m helpers.parity_sweep [--sample] [--out DIR]

Layouts of one world size train in one torchrun (helpers.parity_worker) through the runtime's
own loop; a layout that crashes is recorded with its exception's last line and the rest go on;
one that stops making progress for STALL_S is killed with its torchrun, recorded as a hang, and
the rest restart in a fresh torchrun. References (one rank, the same model and MTP, and the same
backend, or megatron's for the layouts started from its seed: `run_sweep`) train first. Prints the
table: layout, pass/fail, max relative loss deviation, wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from helpers.convert import lmspec
from helpers.parity_layouts import MODELS, SEED_BACKEND, WORLDS, ParityLayout, enumerate_layouts
from helpers.processes import kill_group
from helpers.torchrun import workers
from lmspec.compiler.build.writer import write_build
from lmspec.compiler.emit.manifest import build_files
from lmspec.compiler.pipeline import make_plan

# fp32 on CPU: a layout changes only the order of sums (TP/SP reductions, DP all-reduce, the pipeline's
# micro-batch order). Measured over 3 steps (the full sweep, 2026-12-01): dense megatron layouts <= 5.2e-8
# relative, DeepSpeed exactly 0, MoE with TP+SP up to 1.7e-4 (tp=4). The first step's losses agree to 1e-8;
# AdamW's first update moves every weight by ~lr x sign(grad), so a near-zero gradient whose sign the sum order
# flips moves by the full lr. With SGD the same tp=4 and tp=2 MoE layouts deviate 1.9e-6 and 1.3e-6: reduction
# noise, not a wrong gradient. The bound sits just above the AdamW spread. torchtitan from the seed's weights
# against megatron's reference (other modeling code, unfused kernels): 5.1e-5 dense and 4.8e-5 MoE at one rank
# by step 3, 1e-8 at step 1: torchtitan decays every parameter as its optimizer builder does, megatron-core no
# norm weight or bias; with train.optimizer.weight_decay=0 the dense pair agrees to 2.6e-8.
RELATIVE_TOLERANCE = 2e-4
STALL_S = 180.0
TESTS_DIR = Path(__file__).resolve().parent.parent

# The CI sample: one layout per feature the sweep covers, fixed so CI time stays bounded.
SAMPLE = (
    ParityLayout("tiny", 2, tp=2, sequence_parallel=True),
    ParityLayout("tiny", 4, tp=2, pp=2, recompute="selective"),
    ParityLayout("tiny", 2, pp=2, virtual_stages=2),
    ParityLayout("tiny_moe", 4, tp=2, ep=2, sequence_parallel=True, recompute="full"),
    ParityLayout("tiny_moe", 2, ep=2, mtp_layers=1),
    ParityLayout("tiny", 2, backend="deepspeed", zero_stage=3, recompute="full"),
    ParityLayout("tiny_moe", 4, backend="deepspeed", zero_stage=2, offload_optimizer=True),
    ParityLayout("tiny", 4, backend="torchtitan", zero_stage=3, recompute="full"),
    ParityLayout("tiny_moe", 2, backend="torchtitan", zero_stage=2),
    ParityLayout("tiny", 4, backend="torchtitan", tp=2, sequence_parallel=True, zero_stage=3),
    ParityLayout("tiny", 4, backend="torchtitan", pp=2, virtual_stages=2, zero_stage=3),
)


@dataclass
class Outcome:
    layout: ParityLayout
    code: int
    wall_s: float
    error: str | None
    losses: list[float]

    def deviation(self, reference: Outcome | None) -> float | None:
        """Max |loss - reference| / |reference| over the steps; None when either did not train."""
        if reference is None or self.code or reference.code or len(self.losses) != len(reference.losses):
            return None
        if not self.losses:
            return None
        return max(abs(a - b) / abs(b) for a, b in zip(self.losses, reference.losses, strict=True))


# The backends whose layouts start from the seed run's weights and equal the seed backend's one-rank reference
SEEDED = (SEED_BACKEND, "torchtitan")

# Layouts one torchrun trains before the next starts: every layout's process groups stay alive in the
# worker (megatron-core's destroy_model_parallel forgets its gloo groups without destroying them, and
# DeepSpeed caches its own), each with busy gloo threads: ~4,500 threads a process after 120 layouts
# slowed each layout tenfold. A fresh torchrun costs ~15 s.
BUILDS_PER_TORCHRUN = 24


def compile_layout(root: Path, layout: ParityLayout) -> Path:
    """The build of `layout` under root (what `lmspec compile -o root OVERRIDES` writes)."""
    plan = make_plan(layout.overrides())
    target = root / plan.name
    write_build(target, build_files(plan))
    return target


def _losses(cwd: Path, name: str) -> list[float]:
    path = cwd / "runs" / name / "metrics.jsonl"
    if not path.is_file():
        return []
    records = [json.loads(line) for line in path.read_text().splitlines()]
    return [r["loss"] for r in records if "loss" in r]


def _worker(world: int, results: Path, builds: Sequence[Path], cwd: Path, log: Path) -> subprocess.Popen:
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",  # its store binds a port of its own: no race for a free port with concurrent runs
        f"--nproc-per-node={world}",
        "--max-restarts=0",
        "-m",
        "helpers.parity_worker",
        str(results),
        *map(str, builds),
    ]
    path = os.pathsep.join(p for p in (str(TESTS_DIR), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    with log.open("a") as fh:
        return subprocess.Popen(command, cwd=cwd, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)


def _kill(proc: subprocess.Popen) -> None:
    """torchrun and its workers: torch.distributed.elastic starts each worker in a session of its own."""
    for pid in workers(proc):
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    kill_group(proc)


def _last_exception(log: Path) -> str:
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines()]
    found = [line for line in lines if line.split(":", 1)[0].endswith(("Error", "Exception", "Interrupt"))]
    return found[-1] if found else (lines[-1] if lines else "no output")


def train_group(world: int, layouts: Sequence[ParityLayout], builds: Sequence[Path], cwd: Path) -> list[Outcome]:
    """Train every build (all of `world` ranks), BUILDS_PER_TORCHRUN at most per torchrun (fewer where one fails)."""
    by_name = {b.name: lay for lay, b in zip(layouts, builds, strict=True)}
    done: dict[str, Outcome] = {}
    results, log = cwd / f"results-w{world}.jsonl", cwd / f"worker-w{world}.log"

    def collect() -> None:
        for r in _read(results):
            if r["name"] in by_name and r["name"] not in done:
                losses = _losses(cwd, r["name"])
                done[r["name"]] = Outcome(by_name[r["name"]], r["code"], r["wall_s"], r["error"], losses)

    while len(done) < len(by_name):
        pending = [b for b in builds if b.name not in done][:BUILDS_PER_TORCHRUN]
        proc = _worker(world, results, pending, cwd, log)
        seen, last_progress = len(done), time.monotonic()
        while proc.poll() is None and time.monotonic() - last_progress < STALL_S:
            time.sleep(0.5)
            collect()
            if len(done) > seen:
                seen, last_progress = len(done), time.monotonic()
        hung = proc.poll() is None
        _kill(proc)
        collect()  # records written between the last poll and the exit
        stuck = next((b.name for b in pending if b.name not in done), None)
        if stuck is not None:  # the build the torchrun was on when it died or stalled
            why = f"no progress for {STALL_S:.0f} s (killed)" if hung else _last_exception(log)
            done[stuck] = Outcome(by_name[stuck], proc.returncode or 1, STALL_S if hung else 0.0, why, [])
    return [done[b.name] for b in builds]


def _read(results: Path) -> Iterable[dict]:
    if not results.is_file():
        return []
    return [json.loads(line) for line in results.read_text().splitlines() if line.strip()]


def _seed_checkpoint(cwd: Path, seed: ParityLayout) -> str:
    """The step directory the seed run wrote (runs/<name>/checkpoints/step_<N>)."""
    found = sorted((cwd / "runs" / seed.name / "checkpoints").glob("step_*"))
    if not found:
        raise AssertionError(f"the seed run {seed.name} wrote no checkpoint; see {cwd}/worker-w1.log")
    return str(found[-1])


def _lmspec_run(cwd: Path, build: Path, *stage: str) -> None:
    result = lmspec("run", str(build), *stage, cwd=cwd, timeout_s=STALL_S)
    if result.returncode:
        raise AssertionError(f"lmspec run {build} {' '.join(stage)}: exit {result.returncode}\n{result.stderr[-3000:]}")


def _imported_seed(root: Path, seed: ParityLayout, backend: str) -> str:
    """The seed's weights as a `backend` checkpoint: the seed build's HF conversion (`--stage convert`), imported
    by a one-rank build of that backend (`--stage import`), as a user moves a checkpoint across backends."""
    _lmspec_run(root, root / "builds" / seed.name, "--stage", "convert")
    importer = ParityLayout(seed.model, 1, backend, mtp_layers=seed.mtp_layers)
    build = compile_layout(root / "builds", importer)
    _lmspec_run(root, build, "--stage", "import", "--from", str(root / "runs" / seed.name / "hf"))
    return str(root / "runs" / importer.name / "imported" / "step_0")


def _train(root: Path, world: int, group: Sequence[ParityLayout]) -> list[Outcome]:
    builds = [compile_layout(root / "builds", lay) for lay in group]
    return train_group(world, group, builds, root)


def run_sweep(root: Path, layouts: Sequence[ParityLayout]) -> list[tuple[Outcome, float | None]]:
    """Seed checkpoints (megatron), the references, then `layouts` by world size; each outcome with its
    deviation from its reference. Every megatron layout starts from its seed's weights (train.init_from), every
    torchtitan layout from the same weights through HF (`_imported_seed`), and both equal the seed backend's
    one-rank reference; DeepSpeed builds its model from train.seed alike on every rank (its table lacks
    init_from) and equals its own one-rank reference."""
    seeds = sorted({lay.seed() for lay in layouts if lay.backend in SEEDED})
    for seed, outcome in zip(seeds, _train(root, 1, seeds), strict=True):
        if outcome.code:
            raise AssertionError(f"the seed run {seed.name} failed: {outcome.error}")
    start = {(s.backend, s.model, s.mtp_layers): _seed_checkpoint(root, s) for s in seeds}
    for backend, model, mtp in {(lay.backend, lay.model, lay.mtp_layers) for lay in layouts if lay.backend in SEEDED}:
        if backend != SEED_BACKEND:
            seed = ParityLayout(model, 1, mtp_layers=mtp).seed()
            start[backend, model, mtp] = _imported_seed(root, seed, backend)

    def started(lay: ParityLayout) -> ParityLayout:
        return replace(lay, init_from=start[lay.backend, lay.model, lay.mtp_layers]) if lay.backend in SEEDED else lay

    def reference(lay: ParityLayout) -> ParityLayout:
        if lay.backend not in SEEDED:
            return lay.reference()
        seeded = start[SEED_BACKEND, lay.model, lay.mtp_layers]
        return ParityLayout(lay.model, 1, SEED_BACKEND, mtp_layers=lay.mtp_layers, init_from=seeded)

    layouts = [started(lay) for lay in layouts]
    references = sorted({reference(lay) for lay in layouts})
    outcomes: dict[ParityLayout, Outcome] = {}
    for world, group in [(1, references), *((w, [lay for lay in layouts if lay.world == w]) for w in WORLDS)]:
        for outcome in _train(root, world, group) if group else []:
            outcomes[outcome.layout] = outcome
    return [(outcomes[lay], outcomes[lay].deviation(outcomes.get(reference(lay)))) for lay in layouts]


def table(rows: Sequence[tuple[Outcome, float | None]]) -> str:
    lines = ["| layout | result | max rel. loss deviation | wall s |", "|---|---|---|---|"]
    for outcome, dev in rows:
        ok = dev is not None and dev <= RELATIVE_TOLERANCE
        result = "pass" if ok else f"FAIL: {outcome.error}" if outcome.error else "FAIL"
        shown = "-" if dev is None else f"{dev:.2e}"
        lines.append(f"| {outcome.layout.name} | {result} | {shown} | {outcome.wall_s:.1f} |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sample", action="store_true", help="only the CI sample")
    parser.add_argument("--out", type=Path, default=None, help="work directory (default: a new temporary one)")
    args = parser.parse_args(argv)
    root = args.out or Path(tempfile.mkdtemp(prefix="parity-"))
    if args.sample:
        layouts = list(SAMPLE)
    else:
        layouts = []
        for model in MODELS:
            for world in WORLDS:
                found = enumerate_layouts(model, world)
                print(f"{model} on {world} ranks: {len(found.accepted)} accepted, {len(found.refused)} refused")
                layouts += found.accepted
    rows = run_sweep(root, layouts)
    print(table(rows))
    failed = sum(1 for o, d in rows if d is None or d > RELATIVE_TOLERANCE)
    print(f"{len(rows) - failed} of {len(rows)} layouts pass (tolerance {RELATIVE_TOLERANCE:g} relative); in {root}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
