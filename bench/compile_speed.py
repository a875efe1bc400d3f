"""How much slower is a cold `lmspec compile` than Hydra composing the same spec tree?

Both run in a fresh Python process (a pre-commit hook or a CI step pays the imports every
time), over repeated runs, alternating, and the medians are compared. The floor is a bare
Hydra compose + resolve of the same preset from lmspec's own specs/: what any
Hydra-based tool pays. Target: lmspec's compile within 1.3x of it, judged on CPU time
(user + sys of the child), which a loaded CI machine distorts far less than wall time;
both are printed.

    .venv/bin/python bench/compile_speed.py [--repeats 9] [--json] [OVERRIDES...]

Exit 1 when the ratio is above the target, 2 when a compile fails. To see where the time goes:
    .venv/bin/python -X importtime -m compiler.cli compile ... 2> imports.txt
"""

from __future__ import annotations

import argparse
import json
import resource
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
LMSPEC = "from compiler.cli import main; main()"  # what the `lmspec` console script runs
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
    """Median wall seconds of each, in fresh processes, alternating so drift hits both."""
    compile_runs, compose_runs = [], []
    with tempfile.TemporaryDirectory(prefix="lmspec-bench-") as out:
        lmspec = [sys.executable, "-c", LMSPEC, "compile", "-o", out, "--spec", PRESET, *overrides]
        hydra = [sys.executable, "-c", HYDRA, str(ROOT / "specs"), PRESET, *overrides]
        _time(lmspec), _time(hydra)  # warm the OS file cache (and __pycache__) once
        for _ in range(repeats):
            compile_runs.append(_time(lmspec))
            compose_runs.append(_time(hydra))
    result: dict[str, float] = {"repeats": repeats, "target_ratio": TARGET_RATIO}
    for i, kind in enumerate(("wall", "cpu")):
        compile_median = statistics.median(r[i] for r in compile_runs)
        compose_median = statistics.median(r[i] for r in compose_runs)
        result.update({f"lmspec_compile_{kind}_s": round(compile_median, 4), f"hydra_compose_{kind}_s": round(compose_median, 4),
                       f"{kind}_ratio": round(compile_median / compose_median, 3)})
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
        for kind in ("wall", "cpu"):
            print(f"{kind:>4}: lmspec compile {result[f'lmspec_compile_{kind}_s']:.3f} s, hydra compose "
                  f"{result[f'hydra_compose_{kind}_s']:.3f} s, ratio {result[f'{kind}_ratio']:.2f}")
        print(f"medians of {args.repeats} cold runs each; target ratio <= {TARGET_RATIO}")
    return 0 if result["cpu_ratio"] <= TARGET_RATIO else 1


if __name__ == "__main__":
    sys.exit(main())
