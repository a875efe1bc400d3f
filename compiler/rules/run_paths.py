"""Rules: the directories a run writes belong to one owner each, and train.init_from names a step.

What may not overlap, and why, is compiler/run_paths.py's (the runtime repeats that check from its own
working directory); here the rule reports it from the compiling one, as the compile's inputs resolved
each path (compiler/inputs.py), with each key's origin.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import PurePosixPath

from lmspec.compiler.build.files import STEP_PREFIX, run_dir, step_number
from lmspec.compiler.errors import Problem, error
from lmspec.compiler.rules.context import RuleContext, TrainingContext
from lmspec.compiler.run_paths import RUN_DIR, describe, overlaps


def run_paths_apart(ctx: RuleContext) -> Iterator[Problem]:
    keys = ("convert.output", "quantize.output", "train.checkpoint.dir", "serve.model_path", "train.init_from")
    show = {key: ctx.show(key) for key in keys}
    show[RUN_DIR] = f"{run_dir(ctx.spec.name)}/ of {ctx.show('name')}"
    for clash in overlaps(ctx.spec, ctx.inputs.resolved):
        yield error(clash.key, describe(clash, show))


def init_from_names_a_step(ctx: TrainingContext) -> Iterator[Problem]:
    """train.init_from names one checkpoint: a `step_<N>` directory, as lmspec writes them."""
    start = ctx.spec.train.init_from
    if not start:
        return  # null, or empty (the schema's string validation)
    path = PurePosixPath(start)
    if step_number(path.name) is None:
        inside_step = step_number(path.parent.name) is not None  # e.g. .../step_20/torch_dist
        suggested = str(path.parent) if inside_step else f"{path}/{STEP_PREFIX}<N>"
        yield error(
            "train.init_from",
            (
                f"{ctx.show('train.init_from')} ends in {path.name!r}, not a checkpoint step directory "
                f"{STEP_PREFIX}<N>: point it at one step of a run's train.checkpoint.dir, e.g. {suggested!r}"
                + ("" if inside_step else " (the `latest` file there names the newest)")
            ),
        )


RULES = (run_paths_apart,)
TRAINING_RULES = (init_from_names_a_step,)
