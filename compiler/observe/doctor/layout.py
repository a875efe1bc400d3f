"""A parallel layout the model does not divide into: layers over pipeline stages, experts over
expert-parallel ranks, or a bare ``ensure_divisibility`` (heads, KV heads or vocab over TP). `lmspec
check` refuses these layouts before a run, so the log comes from a run lmspec did not build or a spec
changed after its build.

Formats: megatron/core/transformer/transformer_block.py (``num_layers should be divisible by
pipeline_model_parallel_size``), transformer_config.py (``number of middle layers: 61 must be divisible
by ...``, ``num_moe_experts (64) should be divisible by ...``), and ``ensure_divisibility`` of
megatron/core/utils.py and vllm/distributed/utils.py (``AssertionError: 16 is not divisible by 3``).
"""

from __future__ import annotations

import re

from lmspec.compiler.observe.doctor.findings import Finding, Fix, LogText, Watch
from lmspec.compiler.observe.logs.context import RunContext

_LAYERS = re.compile(
    r"num_layers should be divisible by pipeline_model_parallel_size"
    r"|number of (?:middle )?layers(?: at middle stage)?: (\d+) must be divisible by"
)
_EXPERTS = re.compile(r"num_moe_experts \((\d+)\) should be divisible by")
_BARE = re.compile(r"^\s*(?:\w+Error: )?(\d+) is not divisible by (\d+)\s*$")
_VLLM = re.compile(r"vllm", re.IGNORECASE | re.ASCII)  # the log is vLLM's: serve.* keys, not parallel.*


def _divisors(n: int, most: int) -> str:
    return ", ".join(str(d) for d in range(1, min(n, most) + 1) if n % d == 0)


class ParallelLayout:
    name = "parallel_layout"
    watches = (
        Watch(_LAYERS, (b"num_layers should be divisible by", b" must be divisible by")),
        Watch(_EXPERTS, (b"num_moe_experts (",)),
        Watch(_BARE, (b" is not divisible by ",)),
        Watch(_VLLM, (b"vllm",), keep=1),
    )

    def detect(self, log: LogText, context: RunContext | None) -> Finding | None:
        model = context.spec.model if context else None
        if hits := log.find(_LAYERS):
            layers = model.num_layers if model else None
            value = f"<one of {_divisors(layers, 64)}>" if layers else "<a divisor of model.num_layers>"
            return Finding(
                self.name,
                "layers do not divide over the pipeline stages",
                "Megatron gives every pipeline stage the same number of layers; parallel.pp does not divide "
                "model.num_layers.",
                tuple(e for e, _ in hits),
                (
                    Fix("parallel.pp", value, "pipeline stages must divide the layers"),
                    Fix("parallel.pp_layout", "auto", "or a balanced uneven split of the layers"),
                ),
            )
        if hits := log.find(_EXPERTS):
            experts = int(hits[0][1].group(1))
            return Finding(
                self.name,
                "experts do not divide over expert-parallel ranks",
                f"The {experts} experts must split evenly over parallel.ep.",
                tuple(e for e, _ in hits),
                (Fix("parallel.ep", f"<one of {_divisors(experts, 256)}>", f"a divisor of {experts}"),),
            )
        if hits := log.find(_BARE):
            size, parts = int(hits[0][1].group(1)), int(hits[0][1].group(2))
            key = "serve.tp" if log.find(_VLLM, 1) else "parallel.tp"
            fitting = [d for d in range(1, parts + 1) if size % d == 0]
            return Finding(
                self.name,
                "a model dimension does not divide over the ranks",
                f"{size} (attention or KV heads, experts or vocabulary, as the traceback shows) does not split "
                f"evenly over {parts} ranks.",
                tuple(e for e, _ in hits),
                (Fix(key, str(max(fitting)), f"the largest divisor of {size} up to {parts}"),),
            )
        return None
