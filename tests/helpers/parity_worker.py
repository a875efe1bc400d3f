"""One torchrun that trains many builds of the same world size in sequence, through the runtime's own loop.

    python -m torch.distributed.run --nproc-per-node=W -m helpers.parity_worker RESULTS BUILD...

Each build goes through what `python -m lmspec.runtime.train BUILD` runs after the process group
is up (load_build, the run-path and data checks, `train`), so only the torchrun start (~15 s here)
is shared. The process group is made once, from the first build (every build has the same world).
megatron-core's CPU patches stay entered for the whole process (blocks nest), so a layout that
fails half-built leaves none of them half-undone; its model-parallel state is destroyed before
the next. Rank 0 appends one JSON line per build to RESULTS: {"name", "code", "wall_s", "error"}.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from pathlib import Path

import torch.distributed as dist

from lmspec.compiler.errors import EXIT_FAILED
from lmspec.compiler.run_paths import require_run_paths_apart
from lmspec.runtime.compat.megatron import megatron_on_cpu
from lmspec.runtime.data.preflight import data_ready
from lmspec.runtime.train.loop import init_distributed, load_build, train


def _train_one(build_dir: Path) -> tuple[int, str | None]:
    """(exit code, the exception's last line) of one build trained as the runtime's main would."""
    try:
        build = load_build(build_dir)
        require_run_paths_apart(build.spec)
        if not data_ready(build.plan, report=dist.get_rank() == 0):
            return EXIT_FAILED, "data preflight failed"
        return train(build), None
    except Exception as exc:  # the sweep records every failure and goes on with the next layout
        traceback.print_exc()
        return EXIT_FAILED, traceback.format_exception_only(exc)[-1].strip()
    finally:
        from megatron.core import parallel_state

        if parallel_state.model_parallel_is_initialized():
            parallel_state.destroy_model_parallel()


def main(argv: list[str]) -> int:
    results, builds = Path(argv[0]), [Path(a) for a in argv[1:]]
    first = load_build(builds[0])
    init_distributed(first.spec, first.plan)
    with megatron_on_cpu():
        for build_dir in builds:
            started = time.perf_counter()
            code, error = _train_one(build_dir)
            dist.barrier()
            if dist.get_rank() == 0:
                record = {"name": build_dir.name, "code": code, "wall_s": time.perf_counter() - started, "error": error}
                with results.open("a") as fh:
                    fh.write(json.dumps(record) + "\n")
                print(f"parity: {build_dir.name}: exit {code} {error or ''}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":  # required: dist_checkpointing's save spawns a multiprocessing Manager
    sys.exit(main(sys.argv[1:]))
