"""Rules of `parallel.overlap`: what megatron-core requires before it overlaps the expert all-to-alls.

megatron-core's TransformerConfig asserts these when `overlap_moe_expert_parallel_comm` is set; lmspec says
them first, with the keys. Which targets run the overlaps at all is the capability table's
(compiler/capabilities.py: TP overlap nowhere yet, the all-to-all overlap on GPUs with Megatron).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from lmspec.compiler.errors import Problem, error
from lmspec.compiler.models.moe_dispatch import moe_a2a_overlaps
from lmspec.compiler.rules.context import TrainingContext

KEY = "parallel.overlap.moe_a2a"


# The condition of the rule below as plain arithmetic, true where legal: ints or numpy arrays alike, so
# `lmspec plan`, which searches the overlap, drops exactly what the rule rejects (compiler/search/legality.py).
def moe_a2a_has_its_layout(
    moe_a2a: Any, ep: Any, full_recompute: Any, pp: Any, virtual_stages: Any, half_precision: Any, mtp_layers: Any
) -> Any:
    """`virtual_stages` is 1 for plain 1F1B (parallel.virtual_stages=null)."""
    layout = moe_a2a_overlaps(1, ep, full_recompute, pp, virtual_stages)
    model = (half_precision != 0) & ((mtp_layers == 0) | ((mtp_layers == 1) & (pp > 1)))
    return (moe_a2a == 0) | (layout & model)


def moe_a2a_needs_its_layout(ctx: TrainingContext) -> Iterator[Problem]:
    p, t, m = ctx.spec.parallel, ctx.spec.train, ctx.spec.model
    if not p.overlap.moe_a2a:
        return
    asked = ctx.show(KEY)
    if p.ep == 1:
        yield error(KEY, f"{asked} overlaps expert all-to-alls, but {ctx.show('parallel.ep')}: set {KEY}=false")
    if t.recompute == "full":
        yield error(
            KEY,
            f"{asked} needs the layers' activations kept (megatron-core's combined 1F1B schedule), but "
            f"{ctx.show('train.recompute')}: set train.recompute=selective or {KEY}=false",
        )
    if p.pp > 1 and p.virtual_stages is None:
        yield error(
            KEY,
            f"{asked} with {ctx.show('parallel.pp')} pairs the micro-batches of an interleaved pipeline "
            f"(megatron-core asserts virtual_pipeline_model_parallel_size), but {ctx.show('parallel.virtual_stages')}: "
            f"set parallel.virtual_stages=2 (or more) or {KEY}=false",
        )
    if t.precision == "fp32":
        yield error(
            KEY, f"{asked} runs a bf16 or fp16 model only, but {ctx.show('train.precision')}: set train.precision=bf16"
        )
    if m.mtp_layers > 1 or (m.mtp_layers == 1 and p.pp == 1):
        yield error(
            KEY,
            f"{asked} takes at most one multi-token-prediction layer, on a pipeline (pp > 1), but "
            f"{ctx.show('model.mtp_layers')} with {ctx.show('parallel.pp')}: set {KEY}=false",
        )


RULES = (moe_a2a_needs_its_layout,)
