"""`python -m lmspec.runtime.train <build dir>`: what launch/torchrun.sh runs on every rank."""

import sys

if __name__ == "__main__":  # required: dist_checkpointing's save spawns a multiprocessing Manager
    import os
    import signal

    from lmspec.runtime.process_group import die_with_parent

    # first, before seconds of imports: a rank whose torchrun agent dies (with `lmspec run`, or killed)
    # checkpoints and stops, as nobody is left to watch it (lmspec.runtime.process_group)
    die_with_parent(os.getppid(), signal.SIGTERM)

    from lmspec.runtime.log import setup_logging

    setup_logging()  # before megatron-core's import, whose warnings it then shows once per run (runtime/log.py)

    from lmspec.runtime.train.loop import main
    from lmspec.runtime.train.rank_exit import run_rank

    # under torchrun's `record`: a rank's uncaught error reaches torchrun's failure summary on its node's console,
    # whose workers write to their own files there (launch/torchrun.sh); a full or read-only disk is one line, and
    # the rank's end is recorded for `lmspec run`'s summary (runtime/train/rank_exit.py)
    sys.exit(run_rank(main, sys.argv[1:]))
