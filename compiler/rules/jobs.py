"""Which parts of a job the spec has: train and serve, train only (serve: null), serve only (train: null).

Each part's rules run only when that part is present (rules/__init__.py); these say whether the
parts present make a job: something to do, a layout for training, a model for serving.
"""

from __future__ import annotations

from collections.abc import Iterator

from lmspec.compiler.errors import Problem, error, warning
from lmspec.compiler.rules.context import RuleContext


def spec_has_a_job(ctx: RuleContext) -> Iterator[Problem]:
    if ctx.spec.train is None and ctx.spec.serve is None:
        yield error(
            "train",
            f"{ctx.show('train')} and {ctx.show('serve')}: the spec neither trains nor serves; "
            "keep a train section (train=default) or a serve section (serve=default with serve.model_path=DIR)",
        )


def training_has_a_layout(ctx: RuleContext) -> Iterator[Problem]:
    if ctx.spec.train is not None and ctx.spec.parallel is None:
        yield error(
            "parallel",
            f"{ctx.show('parallel')} but the spec trains: training needs a parallel layout; "
            "set parallel=default, or train=null for a serve-only job",
        )


def serving_has_a_model(ctx: RuleContext) -> Iterator[Problem]:
    s = ctx.spec
    if s.serve is None or s.serve.model_path is not None:
        return
    if s.train is None:
        yield error(
            "serve.model_path",
            f"{ctx.show('serve.model_path')} in a serve-only job ({ctx.show('train')}): nothing to serve; "
            "set serve.model_path to a HuggingFace model directory (a released one, or a converted checkpoint)",
        )
    elif s.convert is None:
        yield error(
            "serve.model_path",
            f"{ctx.show('serve.model_path')} serves the conversion output, but {ctx.show('convert')}; "
            "set convert=default, or serve.model_path to a HuggingFace model directory",
        )


def serve_only_leaves_training_sections_unread(ctx: RuleContext) -> Iterator[Problem]:
    s = ctx.spec
    if s.train is not None or s.serve is None:
        return
    unread = [name for name in ("parallel", "convert") if getattr(s, name) is not None]
    if unread:
        yield warning(
            unread[0],
            f"{' and '.join(unread)} {'are' if len(unread) > 1 else 'is'} not read in a serve-only job "
            f"({ctx.show('train')}): serve.tp/pp/dp lay out the engine and serve.model_path is served as it is; "
            + " ".join(f"{name}=null" for name in unread)
            + " says so",
        )


RULES = (spec_has_a_job, training_has_a_layout, serving_has_a_model, serve_only_leaves_training_sections_unread)
