"""How much slower is a cold `lmspec compile` than Hydra composing the same spec tree?

Both run in a fresh Python process (a pre-commit hook or a CI step pays the imports every
time), over repeated runs, alternating, and the medians are compared. The floor is a bare
Hydra compose + resolve of the same preset from lmspec's own specs/: what any
Hydra-based tool pays. Target: lmspec's compile within 1.3x of it.

    .venv/bin/python bench/compile_speed.py [--repeats 9] [--json] [OVERRIDES...]

Exit 1 when the ratio is above the target. To see where the time goes:
    .venv/bin/python -X importtime -m compiler.cli compile ... 2> imports.txt
"""

from __future__ import annotations

import argparse
import json
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
LMSPEC = "import sys; from compiler.cli import run; sys.exit(run(sys.argv[1:]))"
HYDRA = """
import sys
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
with initialize_config_dir(config_dir=sys.argv[1], version_base=None, job_name="bench"):
    cfg = compose(config_name=sys.argv[2], overrides=sys.argv[3:])
OmegaConf.to_container(cfg, resolve=True)
"""


def _time(argv: list[str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=120)
    if done.returncode != 0:
        raise SystemExit(f"bench: {' '.join(argv[3:])} failed (exit {done.returncode}):\n{done.stderr}")
    return time.perf_counter() - start


def measure(repeats: int, overrides: list[str]) -> dict[str, float]:
    """Median wall seconds of each, in fresh processes, alternating so drift hits both."""
    compile_s, compose_s = [], []
    with tempfile.TemporaryDirectory(prefix="lmspec-bench-") as out:
        lmspec = [sys.executable, "-c", LMSPEC, "compile", "-o", out, "--spec", PRESET, *overrides]
        hydra = [sys.executable, "-c", HYDRA, str(ROOT / "specs"), PRESET, *overrides]
        _time(lmspec), _time(hydra)  # warm the OS file cache (and __pycache__) once
        for _ in range(repeats):
            compile_s.append(_time(lmspec))
            compose_s.append(_time(hydra))
    compile_median, compose_median = statistics.median(compile_s), statistics.median(compose_s)
    return {"repeats": repeats, "lmspec_compile_s": round(compile_median, 4),
            "hydra_compose_s": round(compose_median, 4), "ratio": round(compile_median / compose_median, 3),
            "target_ratio": TARGET_RATIO}


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
        print(f"lmspec compile (deepseek_v3, cold): {result['lmspec_compile_s']:.3f} s median of {args.repeats}\n"
              f"hydra compose of the same tree:    {result['hydra_compose_s']:.3f} s\n"
              f"ratio {result['ratio']:.2f} (target <= {TARGET_RATIO})")
    return 0 if result["ratio"] <= TARGET_RATIO else 1


if __name__ == "__main__":
    sys.exit(main())
