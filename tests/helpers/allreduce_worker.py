"""Stand-in for lmspec.runtime.train in launch tests: a gloo all-reduce over every rank torchrun started.

Run through the real launch path (sbatch -> srun -> torchrun.sh -> torch.distributed.run);
each rank records what it saw in $ALLREDUCE_OUT/rank<N>.json, and prints a line and a warning (as libraries
do on every rank). $ALLREDUCE_FAIL_RANK makes that
rank exit non-zero after the collective, to prove the exit code reaches sbatch.
$ALLREDUCE_AWAIT_USR1=1 makes each rank wait for SIGUSR1 (Slurm's pre-timeout signal), as
the trainer does to checkpoint, and record the run's restart count after a requeue.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist

FAIL_EXIT_CODE = 7
USR1_WAIT_S = 120.0


def main() -> int:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total)
    record = {
        "rank": rank,
        "world_size": world,
        "local_rank": int(os.environ["LOCAL_RANK"]),
        "sum": total.item(),
        "argv": sys.argv[1:],
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        "gloo_socket_ifname": os.environ.get("GLOO_SOCKET_IFNAME"),
    }
    # what a third-party library does on every rank: one line on stdout, one warning on stderr
    print(f"allreduce_worker: rank {rank} of {world}", flush=True)
    warnings.warn(f"allreduce_worker: a library warning from rank {rank}", stacklevel=1)
    out = Path(os.environ["ALLREDUCE_OUT"])
    restarts = record["restarts"] = int(os.environ.get("SLURM_RESTART_COUNT", "0"))
    if os.environ.get("ALLREDUCE_AWAIT_USR1") == "1" and restarts == 0:
        record.update(_await_usr1(out / f"rank{rank}.ready"))
    name = f"rank{rank}.json" if restarts == 0 else f"rank{rank}.restart{restarts}.json"
    (out / name).write_text(json.dumps(record))
    dist.destroy_process_group()
    return FAIL_EXIT_CODE if os.environ.get("ALLREDUCE_FAIL_RANK") == str(rank) else 0


def _await_usr1(ready: Path) -> dict[str, object]:
    """Like the trainer: a USR1 handler, then wait for Slurm's pre-timeout signal."""
    got: list[str] = []
    signal.signal(signal.SIGUSR1, lambda signum, frame: got.append(signal.Signals(signum).name))
    torchrun = os.getppid()
    ready.write_text("waiting for SIGUSR1")
    deadline = time.monotonic() + USR1_WAIT_S
    while not got and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.5)  # had torchrun died of the signal too, this rank would be an orphan by now
    return {"signal": got[0] if got else None, "torchrun_survived": os.getppid() == torchrun}


if __name__ == "__main__":
    sys.exit(main())
