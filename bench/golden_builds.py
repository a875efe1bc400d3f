"""Compile every shipped preset and a fixed set of overrides into one folder, to compare two commits.

A refactor that moves code between modules must not change what a user reviews: the build of every
preset and of the overrides below (both training backends, both launchers, serving, several nodes,
MoE, interleaving, offload) stays byte-identical. Run it before and after, then compare the folders:

    .venv/bin/python bench/golden_builds.py /tmp/golden_before     # on the old commit
    .venv/bin/python bench/golden_builds.py /tmp/golden_after      # on the new one
    .venv/bin/python bench/golden_builds.py --compare /tmp/golden_before /tmp/golden_after [--allow GLOB ...]

`--compare` lists every file added, removed or changed and exits 1 when any is outside `--allow`
(a file the change is meant to add, as `*/megatron/*`). The memory chart is left out: it is drawn
by matplotlib, whose output is not part of lmspec's contract.
"""

from __future__ import annotations

import argparse
import fnmatch
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PRESETS = sorted(p.stem for p in (ROOT / "specs").glob("*.yaml") if p.stem != "config")
# (build name, overrides): the default spec's neighbours a refactor of backends and launchers touches.
OVERRIDES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("default", ()),
    ("tiny_tp2", ("parallel.tp=2",)),
    ("tiny_pp2_v2", ("parallel.pp=2", "parallel.virtual_stages=2")),
    ("tiny_deepspeed_z2", ("train.backend=deepspeed", "parallel.zero_stage=2")),
    ("tiny_deepspeed_offload", ("train.backend=deepspeed", "parallel.zero_stage=3", "parallel.offload_optimizer=true")),
    ("tiny_slurm", ("cluster=slurm",)),
    ("tiny_two_nodes", ("hardware.nodes=2",)),
    ("tiny_linear_lr", ("train.lr_schedule.decay=linear",)),
    ("tiny_moe_ep2", ("model=tiny_moe", "parallel.ep=2")),
    ("llama3_8b_h100", ("model=llama3_8b", "hardware=h100_80g", "parallel.tp=8", "train.precision=bf16")),
    (
        "llama3_70b_slurm",
        (
            "model=llama3_70b",
            "hardware=h100_80g",
            "hardware.nodes=8",
            "parallel.tp=8",
            "parallel.pp=4",
            "parallel.distributed_optimizer=true",
            "train.precision=bf16",
            "train.recompute=selective",
            "cluster=slurm",
            "serve=null",
        ),
    ),
    (
        "mixtral_deepspeed",
        (
            "model=mixtral_8x7b",
            "hardware=h100_80g",
            "hardware.nodes=4",
            "train.backend=deepspeed",
            "train.transformer_impl=local",
            "parallel.zero_stage=3",
            "train.precision=bf16",
            "train.recompute=full",
            "serve=null",
        ),
    ),
)
CHART = "report/memory.svg"
LMSPEC = "import sys; from lmspec.compiler.cli.main import main; sys.exit(main())"  # what the console script runs


def _lmspec(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", LMSPEC, *args], capture_output=True, text=True)


def compile_all(out: Path) -> int:
    failures = 0
    jobs = [(name, ("--spec", name)) for name in PRESETS] + [(n, o) for n, o in OVERRIDES]
    for name, args in jobs:
        target = out / name
        done = _lmspec("compile", *args, "-o", str(target))
        status = "ok" if done.returncode == 0 else f"exit {done.returncode}: {done.stderr.strip()[-300:]}"
        failures += done.returncode != 0
        print(f"{name:40s} {status}")
    return 1 if failures else 0


def _files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not str(p.relative_to(root)).endswith(CHART)
    }


def compare(before: Path, after: Path, allowed: list[str]) -> int:
    old, new = _files(before), _files(after)
    unexpected = 0
    for rel in sorted(old.keys() | new.keys()):
        if old.get(rel) == new.get(rel):
            continue
        kind = "added" if rel not in old else "removed" if rel not in new else "changed"
        ok = any(fnmatch.fnmatch(rel, pattern) for pattern in allowed)
        unexpected += not ok
        print(f"{kind:8s} {rel}{'' if ok else '   <- not allowed'}")
    same = len(old.keys() & new.keys()) - sum(1 for r in old.keys() & new.keys() if old[r] != new[r])
    print(f"{same} files byte-identical, {unexpected} differences outside --allow")
    return 1 if unexpected else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", nargs="+", type=Path, help="OUT to compile into, or BEFORE AFTER with --compare")
    parser.add_argument("--compare", action="store_true", help="compare two folders this script wrote")
    parser.add_argument("--allow", action="append", default=[], help="a glob of files the change may add or alter")
    args = parser.parse_args()
    if args.compare:
        if len(args.folders) != 2:
            parser.error("--compare takes BEFORE AFTER")
        return compare(args.folders[0], args.folders[1], args.allow)
    if len(args.folders) != 1:
        parser.error("give one folder to compile into")
    return compile_all(args.folders[0])


if __name__ == "__main__":
    sys.exit(main())
