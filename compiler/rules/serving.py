"""Rules of the serving layout."""

from __future__ import annotations

from collections.abc import Iterator

from compiler.errors import Problem, error, warning
from compiler.layout import divisors
from compiler.rules.context import RuleContext


def serve_tp_divides_heads(ctx: RuleContext) -> Iterator[Problem]:
    heads, tp = ctx.spec.model.num_attention_heads, ctx.spec.serve.tp
    if heads % tp:
        yield error("serve.tp", (
            f"{ctx.show('serve.tp')} does not divide {ctx.show('model.num_attention_heads')}; "
            f"valid: {', '.join(map(str, divisors(heads)))}"))


def serve_len_within_positions(ctx: RuleContext) -> Iterator[Problem]:
    s = ctx.spec
    if s.serve.max_model_len > s.model.max_position_embeddings:
        yield error("serve.max_model_len", (
            f"{ctx.show('serve.max_model_len')} exceeds {ctx.show('model.max_position_embeddings')}; "
            f"use serve.max_model_len<={s.model.max_position_embeddings}"))
    elif s.serve.max_model_len < s.train.seq_length:
        yield warning("serve.max_model_len", (
            f"{ctx.show('serve.max_model_len')} is shorter than {ctx.show('train.seq_length')}: "
            "requests as long as the training sequences will be rejected"))


def serve_expert_parallel_needs_moe(ctx: RuleContext) -> Iterator[Problem]:
    if ctx.spec.serve.expert_parallel and ctx.spec.model.moe is None:
        yield error("serve.expert_parallel", (
            f"{ctx.show('serve.expert_parallel')} needs a MoE model ({ctx.show('model.moe')}); "
            "set serve.expert_parallel=false"))


RULES = (serve_tp_divides_heads, serve_len_within_positions, serve_expert_parallel_needs_moe)
