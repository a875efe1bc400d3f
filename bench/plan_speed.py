"""Speed of `lmspec plan` on the full DeepSeek-V3 space up to 4096 GPUs (no GPU needed).

    .venv/bin/python bench/plan_speed.py [--repeat 3] [--max-gpus 4096]

Prints the raw candidates covered, the legal candidates priced by the memory model (and,
for those that fit, the step-time model), the wall and CPU time of the whole search
(enumeration, pricing, ranking; Hydra composition excluded) and the rates, best of --repeat
runs. Targets (issue 8): < 2 s, >= 1e5 candidates/s. On a shared, loaded machine the wall
time overstates the cost; the CPU time of this single-threaded process does not.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lmspec.compiler.search.search import search  # noqa: E402
from lmspec.compiler.spec.load import compose_spec  # noqa: E402
from lmspec.compiler.spec.sections import Spec  # noqa: E402
from lmspec.compiler.spec.typed import from_dict  # noqa: E402

TARGET_SECONDS = 2.0
TARGET_RATE = 1e5


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--max-gpus", type=int, default=4096)
    parser.add_argument("overrides", nargs="*", default=["model=deepseek_v3", "hardware=h800_80g"])
    args = parser.parse_args()
    spec = from_dict(Spec, compose_spec(args.overrides).spec)
    nodes = range(1, args.max_gpus // spec.hardware.gpus_per_node + 1)
    runs = []
    for _ in range(args.repeat):
        start, cpu_start = time.perf_counter(), time.process_time()
        result = search(spec, nodes, ("megatron", "deepspeed"), "throughput")
        runs.append((time.perf_counter() - start, time.process_time() - cpu_start, result))
    wall, cpu, result = min(runs, key=lambda run: run[0])
    load = os.getloadavg()[0]
    print(
        f"job: {' '.join(args.overrides)}; GPU counts {spec.hardware.gpus_per_node}..{args.max_gpus} "
        f"({len(nodes)} node counts)"
    )
    print(f"raw candidates:    {result.raw_size:>14,}  ({result.raw_size / wall:,.0f} /s)")
    print(f"legal, priced:     {result.legal:>14,}  ({result.legal / wall:,.0f} /s)")
    print(f"fit in memory:     {result.feasible:>14,}")
    print(
        f"wall time:         {wall:>14.3f} s  (best of {args.repeat}: "
        f"{', '.join(f'{w:.3f}' for w, _, _ in runs)}; load average {load:.1f} on {os.cpu_count()} CPUs)"
    )
    print(f"CPU time:          {cpu:>14.3f} s  (this process; equals the wall time on an idle machine)")
    verdict = {
        name: seconds < TARGET_SECONDS and result.legal / seconds >= TARGET_RATE
        for name, seconds in (("wall", wall), ("CPU", cpu))
    }
    print(
        f"targets (< {TARGET_SECONDS:g} s, >= {TARGET_RATE:.0e} priced candidates/s): "
        + ", ".join(f"{name} time {'met' if ok else 'MISSED'}" for name, ok in verdict.items())
    )
    return 0 if verdict["wall"] else 1


if __name__ == "__main__":
    sys.exit(main())
