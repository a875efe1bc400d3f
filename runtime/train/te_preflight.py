"""Transformer Engine and a GPU, checked before a rank builds anything when the build asks for them.

`train.transformer_impl=transformer_engine` builds TE's layers, which run only on NVIDIA GPUs and
only where the `transformer_engine` package imports. Without this check the run would die inside
megatron-core (TE's layers are mock classes there when TE is missing) with a long traceback; here it
stops first, each problem naming the key and both ways out; with train.precision=fp8 or fp4, the
installed TE's version against the recipe's and TE's own check that this GPU and CUDA run it follow.
Run by every rank of the training entry point (reported once per node) with the same exit code as
the data preflight, and by `lmspec run` before it starts torchrun (cluster.launcher=local), through
the interpreter the ranks will use: `python -m lmspec.runtime.train.te_preflight BUILD_DIR`.
"""

from __future__ import annotations

import importlib
import logging
import sys
from pathlib import Path

from lmspec.compiler.build.reader import Build
from lmspec.compiler.errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE, Problem, error, print_problems
from lmspec.compiler.models.recipes import Recipe, recipe_of
from lmspec.compiler.spec.sections import TrainingSpec

logger = logging.getLogger(__name__)

TE_PREFLIGHT_MODULE = "lmspec.runtime.train.te_preflight"
KEY = "train.transformer_impl"
INSTALL = "pip install transformer_engine[pytorch]"
# train.fp8_recipe / train.fp4_recipe -> the function of transformer_engine.pytorch.fp8 that says whether this
# GPU runs it
SUPPORT_CHECKS = {
    "delayed": "check_fp8_support",
    "tensorwise": "check_fp8_support",
    "blockwise": "check_fp8_block_scaling_support",
    "mxfp8": "check_mxfp8_support",
    "nvfp4": "check_nvfp4_support",
}


def check_transformer_engine(spec: TrainingSpec) -> list[Problem]:
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
    recipe = recipe_of(spec)
    if not problems and recipe is not None:
        problems += _check_recipe(recipe)
    return problems


def _check_recipe(recipe: Recipe) -> list[Problem]:
    """The installed TE against the release that first built the recipe (compiler/models/recipes.py, as
    megatron-core checks it), then TE's own verdict on this GPU and CUDA: delayed and tensorwise scaling
    need FP8 tensor cores (Hopper, Ada, Blackwell); blockwise also CUDA >= 12.9, which an H100 node may
    well lack; mxfp8 and nvfp4 Blackwell."""
    from packaging.version import Version

    te = importlib.import_module("transformer_engine")
    named = f"{recipe.key}={recipe.name}"
    fix = f"set train.precision=bf16 and {recipe.key}=null"
    if Version(te.__version__) < Version(recipe.te_version):
        return [
            error(
                recipe.key,
                f"{named} needs Transformer Engine >= {recipe.te_version} ({recipe.te_source}), but "
                f"{te.__version__} is installed; upgrade it (`{INSTALL}`), or {fix}",
            )
        ]
    check = getattr(importlib.import_module("transformer_engine.pytorch.fp8"), SUPPORT_CHECKS[recipe.name], None)
    if check is None:
        return [error(recipe.key, f"{named}: Transformer Engine {te.__version__} has no such recipe; {fix}")]
    supported, reason = check()
    return [] if supported else [error(recipe.key, f"{named} cannot run on this GPU: {reason}; {fix}")]


def transformer_engine_ready(spec: TrainingSpec, *, report: bool = True) -> bool:
    """Print the problems (when `report`); False when there is any."""
    problems = check_transformer_engine(spec)
    if problems and report:
        print_problems(problems)
        logger.error(
            f"lmspec: the build's Transformer Engine layers cannot run here ({len(problems)} error(s)); "
            "nothing was started"
        )
    return not problems


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        logger.error(f"usage: python -m {TE_PREFLIGHT_MODULE} <build dir>")
        return EXIT_USAGE
    return EXIT_OK if transformer_engine_ready(Build.open(Path(argv[0])).training()) else EXIT_FAILED


if __name__ == "__main__":
    from lmspec.runtime.log import setup_logging

    setup_logging()  # as every runtime process's entry (runtime/log.py)
    sys.exit(main(sys.argv[1:]))
