"""Stand-in for runtime.train in launch tests: a gloo all-reduce over every rank torchrun started.

Run through the real launch path (sbatch -> srun -> torchrun.sh -> torch.distributed.run);
each rank records what it saw in $ALLREDUCE_OUT/rank<N>.json. $ALLREDUCE_FAIL_RANK makes that
rank exit non-zero after the collective, to prove the exit code reaches sbatch.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

FAIL_EXIT_CODE = 7


def main() -> int:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total)
    record = {"rank": rank, "world_size": world, "local_rank": int(os.environ["LOCAL_RANK"]),
              "sum": total.item(), "argv": sys.argv[1:], "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
              "gloo_socket_ifname": os.environ.get("GLOO_SOCKET_IFNAME")}
    Path(os.environ["ALLREDUCE_OUT"], f"rank{rank}.json").write_text(json.dumps(record))
    dist.destroy_process_group()
    return FAIL_EXIT_CODE if os.environ.get("ALLREDUCE_FAIL_RANK") == str(rank) else 0


if __name__ == "__main__":
    sys.exit(main())
