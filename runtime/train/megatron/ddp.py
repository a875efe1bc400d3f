"""The DistributedDataParallelConfig megatron-core's DDP wraps the model with: a pure function of spec and layout.

`parallel.overlap` decides Megatron-LM's fast path (training.py get_model, arguments.py): gradient
reduce-scatter overlapped with the backward pass, bucketed (`grad_reduce`), and with the distributed optimizer
the parameter all-gather overlapped with the next forward (`param_gather`: forward pre-hooks; so the trainer
syncs parameters before it saves them). Without grad_reduce the gradients are reduced in one bucket after the
backward. Both run on gloo too (CPU ranks), with the same losses.
Gradients are reduced in fp32 whenever the weights are 16-bit (Megatron-LM's
--accumulate-allreduce-grads-in-fp32, on for bf16).
"""

from __future__ import annotations

from lmspec.compiler.plan import Layout
from lmspec.compiler.spec.sections import TrainingSpec

# Megatron-LM's default bucket when --ddp-bucket-size is unset: at least 40M elements, and 1M per
# data-parallel rank (DP x CP) so each rank's share of a ring reduce stays bandwidth-bound.
MIN_BUCKET_ELEMENTS = 40_000_000
BUCKET_ELEMENTS_PER_DP_RANK = 1_000_000


def bucket_elements(layout: Layout) -> int:
    return max(MIN_BUCKET_ELEMENTS, BUCKET_ELEMENTS_PER_DP_RANK * layout.dp * layout.cp)


def ddp_config(spec: TrainingSpec, layout: Layout):
    """megatron-core's DistributedDataParallelConfig for this spec at this layout."""
    from megatron.core.distributed import DistributedDataParallelConfig

    overlap = spec.parallel.overlap
    distributed_optimizer = layout.distributed_optimizer
    return DistributedDataParallelConfig(
        grad_reduce_in_fp32=spec.train.precision != "fp32",
        overlap_grad_reduce=overlap.grad_reduce,
        overlap_param_gather=overlap.param_gather and distributed_optimizer,
        use_distributed_optimizer=distributed_optimizer,
        bucket_size=bucket_elements(layout) if overlap.grad_reduce else None,
    )
