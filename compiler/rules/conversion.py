"""Rule: convert/mapping.json can shard every tensor of the model over the training layout.

Some sizes pass every layout rule yet no rank split holds them (a fused QKV whose kv groups do not
split over the TP ranks, an MLA projection whose heads do not). The rule builds the mapping's entries
as the emitter will (compiler/conversion/mapping.py), so it runs on a spec every other rule accepts
(rules/__init__.py's ACCEPTED_TRAINING_RULES): a model another rule refuses has no rows to build.
"""

from __future__ import annotations

from collections.abc import Iterator

from lmspec.compiler.build.files import MAPPING
from lmspec.compiler.conversion.mapping import build_entries
from lmspec.compiler.conversion.transforms import MappingError
from lmspec.compiler.errors import Problem, error
from lmspec.compiler.models.dims import ParallelDims
from lmspec.compiler.rules.context import TrainingContext


def mapping_shards_the_model(ctx: TrainingContext) -> Iterator[Problem]:
    if ctx.spec.convert is None:
        return
    dims = ParallelDims.from_spec(ctx.spec)
    assert dims is not None, "the layout rules accepted the spec"
    try:
        build_entries(ctx.spec, dims.stage_layers)
    except MappingError as exc:
        p = ctx.spec.parallel
        yield error(
            "parallel.tp",
            f"parallel.tp={p.tp} (ep {p.ep}, etp {p.etp}): {MAPPING} cannot shard the model: {exc}; "
            "use a parallel.tp that divides model.ffn_hidden_size, model.vocab_size and "
            "model.num_kv_heads (and parallel.ep/etp that divide the experts' sizes)",
        )


RULES = (mapping_shards_the_model,)
