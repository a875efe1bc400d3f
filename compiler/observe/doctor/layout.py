"""A parallel layout the model does not divide into: layers over pipeline stages, experts over
expert-parallel ranks, or a bare ``ensure_divisibility`` (heads, KV heads or vocab over TP). `lmspec
check` refuses these layouts before a run, so the log comes from a run lmspec did not build or a spec
changed after its build.

Formats: megatron/core/transformer/transformer_block.py (``num_layers should be divisible by
pipeline_model_parallel_size``), megatron/training/arguments.py (``Number of layers should be
divisible by the pipeline-model-parallel size``), transformer_config.py (``number of middle layers: 61 must be divisible
by ...``, ``num_moe_experts (64) should be divisible by ...``), and ``ensure_divisibility`` of
megatron/core/utils.py and vllm/distributed/utils.py (``AssertionError: 16 is not divisible by 3``).
The same bare message raised inside a traceback through expert-parallel groups or MoE layers is an
expert-parallel size that does not divide: DeepSpeed's deepspeed/utils/groups.py
(``_create_expert_and_data_parallel`` -> ``_ensure_divisibility(world_size, expert_parallel_size_)``:
``AssertionError: 4 is not divisible by 8``, https://github.com/facebookresearch/FAMBench/pull/103).
"""

from __future__ import annotations

import re

from lmspec.compiler.observe.doctor.findings import Finding, Fix, Hit, LogText, Watch
from lmspec.compiler.observe.logs.context import RunContext

_LAYERS = re.compile(
    r"num_layers should be divisible by pipeline_model_parallel_size"
    r"|Number of layers should be divisible by the pipeline-model-parallel size"
    r"|number of (?:middle )?layers(?: at middle stage)?: (\d+) must be divisible by"
)
_EXPERTS = re.compile(r"num_moe_experts \((\d+)\) should be divisible by")
_BARE = re.compile(r"(?:^\s*|Error: )(\d+) is not divisible by (\d+)\.?\s*$")
BARE = Watch(_BARE, (b" is not divisible by ",))
# What the latest traceback (if any) passed through before a bare divisibility error: a frame that builds
# expert-parallel groups or MoE layers (a function named for experts or MoE, or a file under a moe/ package:
# DeepSpeed's groups._create_expert_and_data_parallel, deepspeed/moe/layer.py, megatron/core/transformer/moe/),
# or the start of a traceback, after which the frames of an earlier one no longer count.
_EXPERT_FRAME = re.compile(
    r"Traceback \(most recent call last\)"
    r"|(?P<frame>File \"[^\"]*[/\\]moe[/\\][^\"]*\", line \d+, in \w+"
    r"|File \"[^\"]*\", line \d+, in \w*(?:expert|[Mm]o[Ee])\w*)"
)
EXPERT_FRAME = Watch(
    _EXPERT_FRAME,
    (b"Traceback (most recent call last)", b"moe", b"expert", b"MoE", b"Moe"),
    keep=0,
    starts=(b"Traceback (most recent call last)", b'File "'),
    track=True,
)
# a vLLM log's divisibility errors are VllmParallelNotDividing's: serve.* keys, not parallel.*
VLLM_LOG = Watch(re.compile(r"vllm", re.IGNORECASE | re.ASCII), (b"vllm",), keep=1)


def bare_divisibility(log: LogText) -> tuple[list[Hit], int, int] | None:
    """``ensure_divisibility``'s message: its hits, the size and the ranks it would not split over."""
    if not (hits := log.find(_BARE)):
        return None
    return hits, int(hits[0][1].group(1)), int(hits[0][1].group(2))


def _expert_function(log: LogText, line: int) -> str | None:
    """The function of an expert-parallel or MoE frame in the traceback that ends at a line, if it has one."""
    match = log.last_match_before(EXPERT_FRAME, line)
    if match is None or match.group("frame") is None:
        return None
    return match.group("frame").rsplit(" in ", 1)[1]


def _divisors(n: int, most: int) -> str:
    return ", ".join(str(d) for d in range(1, min(n, most) + 1) if n % d == 0)


class ParallelLayout:
    name = "parallel_layout"
    watches = (
        Watch(_LAYERS, (b"num_layers should be divisible by", b"Number of layers should be", b" must be divisible by")),
        Watch(_EXPERTS, (b"num_moe_experts (",)),
        BARE,
        EXPERT_FRAME,
        VLLM_LOG,
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
        if (bare := bare_divisibility(log)) and not log.find(VLLM_LOG.pattern, 1):
            hits, size, parts = bare
            fitting = [d for d in range(1, parts + 1) if size % d == 0]
            if function := _expert_function(log, hits[0][0].line):
                return Finding(
                    self.name,
                    "an expert-parallel group does not divide",
                    f"{size} (the world or data-parallel size, or the experts) does not split evenly over {parts} "
                    f"expert-parallel ranks: the check failed while {function} built the expert-parallel groups "
                    "or MoE layers.",
                    tuple(e for e, _ in hits),
                    (Fix("parallel.ep", str(max(fitting)), f"the largest divisor of {size} up to {parts}"),),
                )
            return Finding(
                self.name,
                "a model dimension does not divide over the ranks",
                f"{size} (attention or KV heads, experts or vocabulary, as the traceback shows) does not split "
                f"evenly over {parts} ranks.",
                tuple(e for e, _ in hits),
                (Fix("parallel.tp", str(max(fitting)), f"the largest divisor of {size} up to {parts}"),),
            )
        return None
