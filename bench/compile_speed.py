"""How much slower is a cold `lmspec compile` than Hydra composing the same spec tree?

Every run is a fresh Python process (a pre-commit hook or a CI step pays the imports every
time), repeated, alternating, and medians are compared. The floor is a bare Hydra compose
+ resolve of the same preset from lmspec's own specs/: what any Hydra-based tool pays.
Two kinds of compile are timed:

- rebuild: compiling over the build already on disk, as `compile` and `compile --check`
  do in a team repo whose build/ is committed (the hook's case). Every artifact is
  re-emitted; only the memory chart is kept when it was drawn from the same numbers
  (compiler/build/writer.py keeps the earlier build's), so matplotlib is not imported.
- first build: into an empty directory, drawing the chart (matplotlib's import alone is
  ~0.4 s).

`lmspec check` (the other pre-commit hook: validate only) is timed as well.

Target: rebuild within 1.3x of the floor, judged on CPU time (user + sys of the child),
which a loaded CI machine distorts far less than wall time; everything is printed.
lmspec's modules are byte-compiled first, as site-packages (Hydra's) are by pip and as
Python does on a first run unless PYTHONDONTWRITEBYTECODE is set.

    .venv/bin/python bench/compile_speed.py [--repeats 9] [--json] [OVERRIDES...]

Exit 1 when the ratio is above the target, 2 when a compile fails. To see where the time goes:
    .venv/bin/python -X importtime -m lmspec.compiler.cli.main compile ... 2> imports.txt
"""

from __future__ import annotations

import argparse
import compileall
import json
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET_RATIO = 1.3
# DeepSeek-V3 on 2048 H800 as DeepSeek ran it (pp 16, ep 64, distributed optimizer): the
# largest shipped preset.
PRESET = "deepseek_v3_pretrain_2048gpu_h800_bf16"
LMSPEC = "from lmspec.compiler.cli.main import main; main()"  # what the `lmspec` console script runs
HYDRA = """
import sys
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
with initialize_config_dir(config_dir=sys.argv[1], version_base=None, job_name="bench"):
    cfg = compose(config_name=sys.argv[2], overrides=sys.argv[3:])
OmegaConf.to_container(cfg, resolve=True)
"""


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _time(argv: list[str]) -> tuple[float, float]:
    """(wall s, CPU s) of one fresh process; CPU time is what a loaded CI machine distorts least."""
    cpu, start = _children_cpu_s(), time.perf_counter()
    done = subprocess.run(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=120)
    if done.returncode != 0:
        print(f"bench: {' '.join(argv[3:])} failed (exit {done.returncode}):\n{done.stderr}", file=sys.stderr)
        raise SystemExit(2)
    return time.perf_counter() - start, _children_cpu_s() - cpu


def measure(repeats: int, overrides: list[str]) -> dict[str, float]:
    """Medians of each kind of run, in fresh processes, alternating so drift hits all alike."""
    compileall.compile_dir(ROOT / "compiler", quiet=1)
    runs: dict[str, list[tuple[float, float]]] = {"rebuild": [], "first_build": [], "check": [], "hydra_compose": []}
    with tempfile.TemporaryDirectory(prefix="lmspec-bench-") as work:
        rebuild_out, first_out = Path(work) / "rebuild", Path(work) / "first"
        argv = {
            "rebuild": [sys.executable, "-c", LMSPEC, "compile", "-o", str(rebuild_out), "--spec", PRESET, *overrides],
            "first_build": [
                sys.executable,
                "-c",
                LMSPEC,
                "compile",
                "-o",
                str(first_out),
                "--spec",
                PRESET,
                *overrides,
            ],
            "check": [sys.executable, "-c", LMSPEC, "check", "--spec", PRESET, *overrides],
            "hydra_compose": [sys.executable, "-c", HYDRA, str(ROOT / "specs"), PRESET, *overrides],
        }
        _time(argv["rebuild"]), _time(argv["hydra_compose"])  # the build to rebuild over; warm the OS file cache
        for _ in range(repeats):
            shutil.rmtree(first_out, ignore_errors=True)
            for kind, command in argv.items():
                runs[kind].append(_time(command))
    result: dict[str, float] = {"repeats": repeats, "target_ratio": TARGET_RATIO}
    for i, clock in enumerate(("wall", "cpu")):
        medians = {kind: statistics.median(r[i] for r in timed) for kind, timed in runs.items()}
        for kind, median in medians.items():
            result[f"{kind}_{clock}_s"] = round(median, 4)
        for kind in ("rebuild", "first_build", "check"):
            result[f"{kind}_{clock}_ratio"] = round(medians[kind] / medians["hydra_compose"], 3)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides applied to both (default: none)")
    args = parser.parse_args()
    result = measure(args.repeats, args.overrides)
    if args.json:
        print(json.dumps(result))
    else:
        for clock in ("cpu", "wall"):
            print(
                f"{clock:>4}: hydra compose {result[f'hydra_compose_{clock}_s']:.3f} s; lmspec compile: "
                f"rebuild {result[f'rebuild_{clock}_s']:.3f} s ({result[f'rebuild_{clock}_ratio']:.2f}x), "
                f"first build {result[f'first_build_{clock}_s']:.3f} s ({result[f'first_build_{clock}_ratio']:.2f}x); "
                f"lmspec check {result[f'check_{clock}_s']:.3f} s ({result[f'check_{clock}_ratio']:.2f}x)"
            )
        print(f"medians of {args.repeats} cold runs each; target: rebuild CPU ratio <= {TARGET_RATIO}")
    return 0 if result["rebuild_cpu_ratio"] <= TARGET_RATIO else 1


if __name__ == "__main__":
    sys.exit(main())
