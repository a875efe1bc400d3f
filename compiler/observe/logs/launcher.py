"""Line prefixes that launchers put in front of each rank's output, stripped before parsing.

- torchrun with --tee / log_line_prefix_template: ``[default0]:`` (role name + local rank,
  torch/distributed/elastic/agent/server/local_elastic_agent.py); torch's C++ logs since 2.2
  add ``[rank0]:`` before ``[E1218 20:27:21.426 ProcessGroupNCCL.cpp:629]``.
- Slurm ``srun --label``: ``0: `` (task id, sometimes space-padded).
"""

from __future__ import annotations

import re

_PREFIX = re.compile(r"^(?:\s*\d+:\s|\[[A-Za-z_]*\d+\]:\s?)+")


def strip_prefix(line: str) -> str:
    """The line as the rank printed it."""
    if not line or not (line[0] == "[" or line[0].isdecimal() or line[0].isspace()):
        return line  # no prefix can start here (\s is str.isspace, \d str.isdecimal): most lines
    return _PREFIX.sub("", line, count=1)
