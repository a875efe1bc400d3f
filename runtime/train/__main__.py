"""`python -m lmspec.runtime.train <build dir>`: what launch/torchrun.sh runs on every rank."""

import sys

from lmspec.runtime.train.loop import main

if __name__ == "__main__":  # required: dist_checkpointing's save spawns a multiprocessing Manager
    sys.exit(main(sys.argv[1:]))
