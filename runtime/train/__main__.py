"""`python -m lmspec.runtime.train <build dir>`: what launch/torchrun.sh runs on every rank."""

import sys

if __name__ == "__main__":  # required: dist_checkpointing's save spawns a multiprocessing Manager
    from lmspec.runtime.log import setup_logging

    setup_logging()  # before megatron-core's import, whose warnings it then shows once per run (runtime/log.py)

    from torch.distributed.elastic.multiprocessing.errors import record

    from lmspec.runtime.train.loop import main

    # record: a rank's uncaught error reaches torchrun's failure summary on its node's console, whose workers
    # write to their own files there (launch/torchrun.sh)
    sys.exit(record(main)(sys.argv[1:]))
