"""The `parallel` group: training's parallel layout and the communication it hides behind compute."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from lmspec.compiler.spec import kinds
from lmspec.compiler.spec.sections.declare import Auto, key


@dataclass(frozen=True, kw_only=True)
class OverlapSpec:
    """Communication hidden behind compute, as the backends schedule it (what the step-time model and the
    runtime both read)."""

    grad_reduce: bool = key(
        "Reduce the gradients bucket by bucket while the last micro-batch's backward still runs (Megatron "
        "--overlap-grad-reduce; DeepSpeed ZeRO-1/2/3 overlap_comm); false: one reduce after the backward.",
        example=True,
    )
    param_gather: bool = key(
        "Gather sharded weights ahead of use: Megatron --overlap-param-gather (the next step's first forward "
        "hides the distributed optimizer's all-gather), DeepSpeed ZeRO-3 prefetch (stage3_prefetch_bucket_size); "
        "false: gathered when needed. Weights that are not sharded are never gathered.",
        example=True,
    )
    tp_comm: bool = key(
        "Tensor-parallel all-gathers and reduce-scatters pipelined with their GEMMs through Transformer Engine's "
        "userbuffers (Megatron --tp-comm-overlap; needs sequence parallelism).",
        example=False,
    )
    moe_a2a: bool = key(
        "Expert all-to-alls of one micro-batch hidden behind another micro-batch's compute (megatron-core's "
        "overlap_moe_expert_parallel_comm, the combined 1F1B schedule after DeepSeek-V3's DualPipe; needs "
        "parallel.ep > 1, no full recompute, and parallel.virtual_stages when parallel.pp > 1).",
        example=False,
    )


@dataclass(frozen=True, kw_only=True)
class ParallelSpec:
    """Parallel layout: world = tp x pp x dp x cp; experts sharded by ep (x etp) inside it."""

    tp: int = key("Tensor-parallel degree (must stay inside a node).", example=8, minimum=1, maximum=kinds.RANKS_MAX)
    pp: int = key("Pipeline-parallel stages.", example=1, minimum=1, maximum=kinds.RANKS_MAX)
    dp: int | Auto = key(
        "Data-parallel degree; auto = world / (tp x pp x cp).", example="auto", minimum=1, maximum=kinds.RANKS_MAX
    )
    cp: int = key(
        "Context-parallel degree (sequence split across ranks).", example=1, minimum=1, maximum=kinds.RANKS_MAX
    )
    ep: int = key("Expert-parallel degree for MoE layers.", example=1, minimum=1, maximum=kinds.RANKS_MAX)
    etp: int = key(
        "Tensor-parallel degree inside each expert (Megatron expert_tensor_parallel_size).",
        example=1,
        minimum=1,
        maximum=kinds.RANKS_MAX,
    )
    sequence_parallel: bool = key(
        "Megatron sequence parallelism for norms/dropout inside the TP group (needs tp > 1).", example=False
    )
    zero_stage: Literal[0, 1, 2, 3] = key("DeepSpeed ZeRO stage (deepspeed backend).", example=1)
    distributed_optimizer: bool = key(
        "Megatron distributed optimizer: optimizer states and master weights sharded over DP.", example=False
    )
    offload_optimizer: bool = key("DeepSpeed: keep optimizer states in host memory.", example=False)
    offload_params: bool = key("DeepSpeed ZeRO-3: keep parameters in host memory.", example=False)
    pp_layout: None | Auto | list[int] = key(
        "Layers per pipeline stage: null = num_layers must divide "
        "by pp; auto = balanced uneven split; or an explicit list.",
        example="auto",
        maximum=kinds.LAYERS_MAX,
        max_items=kinds.LAYERS_MAX,
    )
    virtual_stages: int | None = key(
        "Interleaved 1F1B: model chunks per pipeline rank; null = plain 1F1B.",
        example=2,
        minimum=1,
        maximum=kinds.LAYERS_MAX,
    )
    overlap: OverlapSpec = key("Communication hidden behind compute.")
