"""Transformer Engine and a GPU, checked before a rank builds anything when the build asks for them.

`train.transformer_impl=transformer_engine` builds TE's layers, which run only on NVIDIA GPUs and
only where the `transformer_engine` package imports. Without this check the run would die inside
megatron-core (TE's layers are mock classes there when TE is missing) with a long traceback; here it
stops first, each problem naming the key and both ways out. Run by every rank of the training
entry point (reported once per node) with the same exit code as the data preflight.
"""

from __future__ import annotations

import importlib
import sys

from lmspec.compiler.errors import Problem, error, print_problems
from lmspec.compiler.spec.sections import Spec

KEY = "train.transformer_impl"
INSTALL = "pip install transformer_engine[pytorch]"


def check_transformer_engine(spec: Spec) -> list[Problem]:
    """Every reason this process cannot run `spec`'s Transformer Engine layers; none for the local path."""
    if spec.train.transformer_impl != "transformer_engine":
        return []
    import torch

    named = f"{KEY}=transformer_engine"
    problems = []
    if not torch.cuda.is_available():
        problems.append(
            error(
                KEY,
                f"{named} needs an NVIDIA GPU, but this process sees none (torch.cuda.is_available() is False); "
                f"run it on a GPU node, or set {KEY}=local (megatron-core's pure-PyTorch layers)",
            )
        )
    try:
        importlib.import_module("transformer_engine.pytorch")
    except Exception as exc:  # ImportError, or OSError/RuntimeError from a broken CUDA library
        problems.append(
            error(
                KEY,
                f"{named} needs Transformer Engine, but `import transformer_engine.pytorch` fails "
                f"({type(exc).__name__}: {exc}); install it (`{INSTALL}`), or set {KEY}=local",
            )
        )
    return problems


def transformer_engine_ready(spec: Spec, *, report: bool = True) -> bool:
    """Print the problems (when `report`); False when there is any."""
    problems = check_transformer_engine(spec)
    if problems and report:
        print_problems(problems)
        print(
            f"lmspec: {KEY}=transformer_engine cannot run here ({len(problems)} error(s)); nothing was started",
            file=sys.stderr,
            flush=True,
        )
    return not problems
