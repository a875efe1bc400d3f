"""`python -m lmspec.runtime.train <build dir>`: what launch/torchrun.sh runs on every rank."""

import sys

from torch.distributed.elastic.multiprocessing.errors import record

from lmspec.runtime.train.loop import main

if __name__ == "__main__":  # required: dist_checkpointing's save spawns a multiprocessing Manager
    # record: a rank's uncaught error reaches torchrun's failure summary on its node's console, whose workers
    # write to their own files there (launch/torchrun.sh)
    sys.exit(record(main)(sys.argv[1:]))
